#pragma once
// Independent float64 references for the emulated kernels: the coupling,
// QK-norm, RoPE and causal attention written with plain ATen ops (autograd
// gives their gradients), the kernels' parameter structs filled from ATen
// tensors, and what the tests share (the comparison, the parameter names).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "emulator.h"
#include "fused_coupling.h"

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

kernels::AffineCouplingParams params_of(const CouplingWeights& w, bool shared_across_heads, float clamp);
kernels::AffineCouplingGrads grads_of(CouplingWeights& g);

// Element strides of a 4-d [batch, heads, time, dim] view (dim contiguous).
kernels::RowStrides row_strides(const at::Tensor& x);
kernels::ElementType element_type(const at::Tensor& x);

// (q, k) [batch, heads, time, D] after the coupling in float64; head h uses
// weight group group_of_head[h]. Differentiable in q, k and the weights.
std::pair<at::Tensor, at::Tensor> reference_coupling(const at::Tensor& q, const at::Tensor& k,
                                                     const CouplingWeights& weights_f64,
                                                     const std::vector<int64_t>& group_of_head, double clamp);
// The same weights in float64, with requires_grad when asked.
CouplingWeights to_double(const CouplingWeights& w, bool requires_grad);

// RMSNorm over the last dim with weight w [D].
at::Tensor reference_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps);
// Rotate-half RoPE with [time, D/2] tables, over the time dim (-2) of x.
at::Tensor reference_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
// cos and sin of t * base^(-2i/D), [time, D/2] float32.
std::pair<at::Tensor, at::Tensor> rope_tables(int64_t time, int64_t head_dim, double base = 10000.0);

// Causal softmax(q k^T * scale) v over the last two dims.
at::Tensor reference_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale);

// A tensor like x filled with NaN: an element the kernel does not write stays NaN.
at::Tensor poisoned_like(const at::Tensor& x);

// Every element of `actual` is finite and max |actual - expected| is at most
// `tolerance` times max(max |expected|, 1e-2) (the floor: an all-zero
// reference, such as the q gradient of a single token, against float32 rounding).
// Fails the current test otherwise.
void expect_close(const at::Tensor& actual, const at::Tensor& expected, double tolerance, const std::string& what);

inline std::ostream& operator<<(std::ostream& os, RunOrder order) { return os << run_order_name(order); }

// Every case runs in both run orders (emulator.h); the test is named "<case>_<order>".
inline auto both_run_orders() { return ::testing::Values(RunOrder::kAscending, RunOrder::kDescending); }
template <class Case>
std::string case_and_order_name(const ::testing::TestParamInfo<std::tuple<Case, RunOrder>>& info) {
  return std::string(std::get<0>(info.param).name) + "_" + run_order_name(std::get<1>(info.param));
}

}  // namespace cqk::emulation
