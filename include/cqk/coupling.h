#pragma once
// The coupled query-key map: a small per-head map that evolves each token's
// (q, k) jointly between the projections and the scoring. See
// docs/METHOD.md for the math and docs/ARCHITECTURE.md for the data flow.
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <utility>
#include <vector>

#include "cqk/headwise_mlp.h"

namespace cqk {

enum class CouplingKind {
  None,           // identity: the base attention
  Affine,         // alternating affine coupling (the method; invertible)
  NonInvertible,  // [q; k] += MLP([q; k]): both updated at once (control)
  Uncoupled,      // q += f(q), k += g(k): extra capacity, no cross term (control)
  Dynamics,       // n steps of q += dt k, k += dt f(q) (the earlier "coupled dynamics")
};

enum class Integrator { Euler, Symplectic };

// The kinds' config names, in enum order: what model.attention.coupling.kind accepts.
const std::vector<std::string>& coupling_kind_names();
CouplingKind parse_coupling_kind(const std::string& name);  // throws std::invalid_argument
std::string to_string(CouplingKind kind);
Integrator parse_integrator(const std::string& name);
std::string to_string(Integrator integrator);

struct CouplingOptions {
  CouplingOptions() = default;
  CouplingOptions(CouplingKind kind, int64_t num_heads, int64_t head_dim)
      : kind_(kind), num_heads_(num_heads), head_dim_(head_dim) {}

  TORCH_ARG(CouplingKind, kind) = CouplingKind::None;
  TORCH_ARG(int64_t, num_heads) = 1;
  TORCH_ARG(int64_t, head_dim) = 64;
  // r, the hidden width of each affine conditioner. The controls derive their
  // own widths so that their parameter count matches Affine's (within 5%).
  TORCH_ARG(int64_t, hidden) = 8;
  // Affine: alternating steps (2 = k from q, then q from k). Dynamics: integration steps.
  TORCH_ARG(int64_t, steps) = 2;
  // The log-scale is soft-clamped to (-clamp, clamp) so exp(s) stays bounded.
  TORCH_ARG(double, clamp) = 2.0;
  TORCH_ARG(bool, shared_across_heads) = false;
  TORCH_ARG(Integrator, integrator) = Integrator::Symplectic;
  // Dynamics: initial dt per head; 0 makes the map the identity at init.
  TORCH_ARG(double, dt_init) = 0.0;
  // Invertible kinds: save only the outputs and rebuild the inputs with the
  // exact inverse in the backward pass, so the coupling keeps no activations.
  TORCH_ARG(bool, recompute_from_inverse) = true;
};

bool is_invertible(const CouplingOptions& options);
// Hidden width of the kind's MLPs: `hidden` for Affine, matched to Affine's
// parameter count for the controls.
int64_t coupling_hidden_width(const CouplingOptions& options);
// Parameters of a coupling with these options (the formula of docs/METHOD.md).
int64_t coupling_parameter_count(const CouplingOptions& options);

class QKCouplingImpl : public torch::nn::Module {
 public:
  explicit QKCouplingImpl(const CouplingOptions& options);

  // q, k: [batch, heads, time, head_dim]. Returns the coupled (q', k'), by the
  // fastest path that covers the inputs (src/ops/qk_path.h).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& q, const at::Tensor& k);
  // The exact inverse: inverse(forward(q, k)) == (q, k). Throws for the
  // non-invertible kinds (NonInvertible, Uncoupled, Dynamics with Euler).
  std::pair<at::Tensor, at::Tensor> inverse(const at::Tensor& q, const at::Tensor& k);

  const CouplingOptions& options() const { return options_; }
  int64_t parameter_count() const;

  // The map itself in ATen, differentiable with plain autograd: the reference
  // every accelerated path is tested against, and the last resort of forward. Affine: `log_scales`, when given, receives each
  // step's clamped log-scale s (coupling_diagnostics.h).
  std::pair<at::Tensor, at::Tensor> transform(at::Tensor q, at::Tensor k,
                                              std::vector<at::Tensor>* log_scales = nullptr) const;
  std::pair<at::Tensor, at::Tensor> inverse_transform(at::Tensor q, at::Tensor k) const;

 private:
  void check_input(const at::Tensor& q, const at::Tensor& k, const char* where) const;

  CouplingOptions options_;
  std::vector<HeadwiseMLP> conditioners_;  // Affine: one per step; NonInvertible: one; Uncoupled: f, g; Dynamics: f
  at::Tensor dt_;                          // Dynamics: [groups]
};
TORCH_MODULE(QKCoupling);

}  // namespace cqk
