#pragma once
// Independent float64 references for the emulated kernels: the coupling,
// QK-norm and RoPE written with plain ATen ops (autograd
// gives their gradients); none of the kernels' code is used.
#include <ATen/ATen.h>

#include <utility>
#include <vector>

namespace cqk::emulation {

// One coupling's weights per step in cqk::HeadwiseMLP's layout, float32:
// w1 [groups, R, D], b1 [groups, R], w2 [groups, 2D, R], b2 [groups, 2D].
struct CouplingWeights {
  std::vector<at::Tensor> w1, b1, w2, b2;
  int64_t groups() const { return w1.front().size(0); }
  int steps() const { return static_cast<int>(w1.size()); }
};

// Random, far from the identity (exp(s) ranges over about 0.5 .. 2).
CouplingWeights random_coupling(int steps, int64_t groups, int64_t head_dim, int64_t hidden);
// Zeroed float32 buffers shaped like `w`, for the weight gradients.
CouplingWeights zeros_like(const CouplingWeights& w);
// The same weights in float64, with requires_grad when asked.
CouplingWeights to_double(const CouplingWeights& w, bool requires_grad);

// (q, k) [batch, heads, time, D] after the coupling in float64; head h uses
// weight group group_of_head[h]. Differentiable in q, k and the weights.
std::pair<at::Tensor, at::Tensor> reference_coupling(const at::Tensor& q, const at::Tensor& k,
                                                     const CouplingWeights& weights_f64,
                                                     const std::vector<int64_t>& group_of_head, double clamp);

// RMSNorm over the last dim with weight w [D].
at::Tensor reference_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps);
// Rotate-half RoPE with [time, D/2] tables, over the time dim (-2) of x.
at::Tensor reference_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
// cos and sin of t * base^(-2i/D), [time, D/2] float32.
std::pair<at::Tensor, at::Tensor> rope_tables(int64_t time, int64_t head_dim, double base = 10000.0);

}  // namespace cqk::emulation
