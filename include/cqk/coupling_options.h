#pragma once
// The coupling's kinds and options: the module's options (coupling.h) and the
// config section model.attention.coupling in one struct, one set of defaults
// (configs/default.yaml's; ConfigLoader.StructDefaultsAreTheEmbeddedDefault).
// Torch-free: the config loader reads it.
#include <cstdint>
#include <string>
#include <vector>

#include "cqk/kind_table.h"
#include "cqk/option.h"

namespace cqk {

enum class CouplingKind {
  None,           // identity: the base attention
  Affine,         // alternating affine coupling (the method; invertible)
  NonInvertible,  // [q; k] += MLP([q; k]): both updated at once (control)
  Uncoupled,      // q += f(q), k += g(k): extra capacity, no cross term (control)
  Dynamics,       // n steps of q += dt k, k += dt f(q) (the earlier "coupled dynamics")
};

enum class Integrator { Euler, Symplectic };

// The config names, in enum order: what model.attention.coupling.kind and .integrator accept.
inline const KindTable<CouplingKind, 5> kCouplingKindNames = {
    {CouplingKind::None, "none"},
    {CouplingKind::Affine, "affine"},
    {CouplingKind::NonInvertible, "noninvertible"},
    {CouplingKind::Uncoupled, "uncoupled"},
    {CouplingKind::Dynamics, "dynamics"}};
inline const KindTable<Integrator, 2> kIntegratorNames = {{Integrator::Euler, "euler"},
                                                          {Integrator::Symplectic, "symplectic"}};

inline const std::vector<std::string>& coupling_kind_names() { return kind_names<kCouplingKindNames>(); }
// Throws std::invalid_argument "unknown coupling kind 'x' (expected none|affine|...)".
inline CouplingKind parse_coupling_kind(const std::string& name) {
  return parse_kind(kCouplingKindNames, name, "coupling kind");
}
inline std::string to_string(CouplingKind kind) { return kind_name(kCouplingKindNames, kind); }
inline const std::vector<std::string>& integrator_names() { return kind_names<kIntegratorNames>(); }
inline std::string to_string(Integrator integrator) { return kind_name(kIntegratorNames, integrator); }

struct CouplingOptions {
  CouplingOptions() = default;
  CouplingOptions(CouplingKind kind, int64_t num_heads, int64_t head_dim)
      : kind_(kind), num_heads_(num_heads), head_dim_(head_dim) {}

  CQK_OPTION(CouplingKind, kind) = CouplingKind::Affine;
  // The shape, set by the attention (not config keys).
  CQK_OPTION(int64_t, num_heads) = 1;
  CQK_OPTION(int64_t, head_dim) = 64;
  // r, the hidden width of each affine conditioner. The controls derive their
  // own widths so that their parameter count matches Affine's (within 5%).
  CQK_OPTION(int64_t, hidden) = 8;
  // Affine: alternating steps (2 = k from q, then q from k). Dynamics: integration steps.
  CQK_OPTION(int64_t, steps) = 2;
  // The log-scale is soft-clamped to (-clamp, clamp) so exp(s) stays bounded.
  CQK_OPTION(double, clamp) = 2.0;
  CQK_OPTION(bool, shared_across_heads) = false;
  // Differential attention: one coupling per (q, k) pair instead of one shared by both.
  CQK_OPTION(bool, separate_pairs) = false;
  CQK_OPTION(Integrator, integrator) = Integrator::Symplectic;
  // Dynamics: initial dt per head; 0 makes the map the identity at init.
  CQK_OPTION(double, dt_init) = 0.0;
  // Invertible kinds: save only the outputs and rebuild the inputs with the
  // exact inverse in the backward pass, so the coupling keeps no activations.
  CQK_OPTION(bool, recompute_from_inverse) = true;
};

}  // namespace cqk
