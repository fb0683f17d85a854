#pragma once
// The q/k path's one decision site: how a coupling's (q, k) become the
// scores' inputs, or the attention output itself, on the fastest path that
// covers them. The coupling module and the attention module each make one
// call here. In order of preference:
//   1. the fused CUDA coupling kernel, QK-norm and RoPE in its pass
//      (cuda_coupling.h), feeding torch's SDPA (sdpa_backend.h);
//   2. the CPU kernel (cpu_coupling.h, src/simd/), RoPE in its pass unless
//      QK-norm comes between;
//   3. ATen: the module's transform, through recompute_from_inverse.h when a
//      backward pass will come (invertible kinds), else plain.
// All run the map in float32 (bf16 inputs are upcast, outputs cast back);
// what a path does not fuse (QK-norm, RoPE) follows (RMSNorm's and
// apply_rope's own kernels, else ATen). Each
// accelerator's *_applies function says what it covers.
#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <utility>
#include <vector>

namespace cqk {

class QKCouplingImpl;
class RMSNormImpl;

namespace ops {

// What the attention applies to the coupled q and k before scoring.
struct BeforeScoring {
  std::optional<double> rope_base;      // RoPE (apply_rope), or none
  const RMSNormImpl* q_norm = nullptr;  // QK-norm of q and of k: both or neither
  const RMSNormImpl* k_norm = nullptr;
};

// How the attention scores prepared (q, k) against v.
struct Scoring {
  std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v)> score;
};

// (q, k): [batch, heads, time, head_dim] -> coupled, then `before` applied.
std::pair<at::Tensor, at::Tensor> couple(QKCouplingImpl& coupling, const at::Tensor& q, const at::Tensor& k,
                                         const BeforeScoring& before = {});

// scoring.score(couple(q, k, before), v).
at::Tensor coupled_attention(QKCouplingImpl& coupling, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const BeforeScoring& before, const Scoring& scoring);

// Differential attention's two (q, k) pairs per head: q, k [batch, 2, heads,
// time, head_dim], v [batch, heads, time, 2 head_dim] shared by the pairs.
// The coupling sees the pairs reshaped to `coupling_shape` (the pair axis in
// its batch or its heads). Returns (A1 v, A2 v), each [batch, heads, time, 2 head_dim].
std::pair<at::Tensor, at::Tensor> paired_coupled_attention(QKCouplingImpl& coupling, const at::Tensor& q,
                                                           const at::Tensor& k, const at::Tensor& v,
                                                           const BeforeScoring& before,
                                                           const std::vector<int64_t>& coupling_shape,
                                                           const Scoring& scoring);

}  // namespace ops
}  // namespace cqk
