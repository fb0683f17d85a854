// kernels/attention_kernels.cu (the flash coupled attention) run on the CPU by
// the emulator (emulator.h): forward (o, lse2) and backward (delta, the
// gradients with respect to the coupled q and k, dv) against float64 ATen
// attention over reference.h's coupling, for vanilla (one pair) and
// differential attention (two pairs sharing v), inputs as strided views.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "emulator.h"
#include "attention_kernels.h"
#include "reference.h"
#include "test_support.h"
#include "tools/check_support.h"

namespace cqk::emulation {
namespace {

using fused_check::poisoned;

struct AttentionCase {
  const char* name;
  int64_t batch, pairs, heads, time, head_dim, value_dim, hidden;
  int steps;
  bool separate_pairs, shared, rope;
  at::ScalarType dtype;
};

std::ostream& operator<<(std::ostream& os, const AttentionCase& c) { return os << c.name; }

constexpr float kClamp = 2.0f;

kernels::PairedRowStrides paired_strides(const at::Tensor& x) {
  return {x.stride(0), x.stride(1), x.stride(2), x.stride(3)};
}

// [batch, pairs, heads, time, dim] as a view of a [batch, time, pairs, heads, dim] buffer.
at::Tensor paired_view(const AttentionCase& c, int64_t dim) {
  return at::randn({c.batch, c.time, c.pairs, c.heads, dim}, at::TensorOptions().dtype(c.dtype))
      .permute({0, 2, 3, 1, 4});
}

int64_t weight_group(const AttentionCase& c, int64_t pair, int64_t head) {
  if (c.shared) return 0;
  return c.separate_pairs ? pair * c.heads + head : head;
}

class EmulatedFlashAttention : public ::testing::TestWithParam<std::tuple<AttentionCase, RunOrder>> {};

TEST_P(EmulatedFlashAttention, ForwardAndBackwardMatchFloat64Autograd) {
  const auto& [c, order] = GetParam();
  const ScopedRunOrder run_order(order);
  at::manual_seed(5);
  const at::Tensor q = paired_view(c, c.head_dim), k = paired_view(c, c.head_dim);
  const at::Tensor v = at::randn({c.batch, c.time, c.heads, c.value_dim}, at::TensorOptions().dtype(c.dtype))
                           .permute({0, 2, 1, 3});
  const int64_t groups = c.shared ? 1 : (c.separate_pairs ? c.pairs * c.heads : c.heads);
  const CouplingWeights weights = random_coupling(c.steps, groups, c.head_dim, c.hidden);
  at::Tensor cos, sin;
  if (c.rope) std::tie(cos, sin) = rope_tables(c.time, c.head_dim);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));

  kernels::CoupledAttentionInputs in;
  in.q = q.data_ptr();
  in.q_strides = paired_strides(q);
  in.k = k.data_ptr();
  in.k_strides = paired_strides(k);
  in.v = v.data_ptr();
  in.v_strides = row_strides(v);
  in.shape = {c.batch, c.pairs, c.heads, c.time, c.head_dim, c.value_dim, c.hidden};
  in.coupling = params_of(weights, c.shared, kClamp);
  in.separate_pair_couplings = c.separate_pairs;
  if (c.rope) in.rope = {cos.data_ptr<float>(), sin.data_ptr<float>()};
  in.softmax_scale = static_cast<float>(scale);

  const auto like_q = at::TensorOptions().dtype(c.dtype);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  at::Tensor o = poisoned(at::empty({c.batch, c.pairs, c.heads, c.time, c.value_dim}, like_q));
  at::Tensor lse2 = poisoned(at::empty({c.batch, c.pairs, c.heads, c.time}, f32));
  const int64_t launches = launch_count();
  kernels::coupled_attention_forward_cuda(element_type(q), in, o.data_ptr(), lse2.data_ptr<float>(), nullptr);
  EXPECT_EQ(launch_count(), launches + 1);

  // The reference: per pair, the coupling (no gradient: the kernels' backward
  // stops at the coupled q and k), then RoPE and causal attention from leaves.
  const CouplingWeights wd = to_double(weights, /*requires_grad=*/false);
  const at::Tensor vd = v.to(at::kDouble).detach().set_requires_grad(true);
  std::vector<at::Tensor> q_coupled, k_coupled, outputs, lses;
  for (int64_t p = 0; p < c.pairs; ++p) {
    std::vector<int64_t> group_of_head;
    for (int64_t h = 0; h < c.heads; ++h) group_of_head.push_back(weight_group(c, p, h));
    const auto [qc, kc] = reference_coupling(q.select(1, p).to(at::kDouble), k.select(1, p).to(at::kDouble), wd,
                                             group_of_head, kClamp);
    q_coupled.push_back(qc.detach().set_requires_grad(true));
    k_coupled.push_back(kc.detach().set_requires_grad(true));
    const at::Tensor qr = c.rope ? reference_rope(q_coupled.back(), cos, sin) : q_coupled.back();
    const at::Tensor kr = c.rope ? reference_rope(k_coupled.back(), cos, sin) : k_coupled.back();
    outputs.push_back(reference_causal_attention(qr, kr, vd, scale));
    const at::Tensor scores = at::matmul(qr, kr.transpose(-2, -1)) * scale;
    const at::Tensor mask = at::ones({c.time, c.time}, at::kBool).triu(1);
    lses.push_back(at::logsumexp(scores.masked_fill(mask, -INFINITY), -1) / std::log(2.0));
  }
  const at::Tensor o_ref = at::stack(outputs, 1), lse2_ref = at::stack(lses, 1);
  const bool bf16 = c.dtype == at::kBFloat16;
  // Tolerances: about 3x the largest errors measured over the cases (2026-12-03).
  // lse2 is float32 in both dtypes, from exactly representable inputs.
  expect_close(o, o_ref, bf16 ? 8e-3 : 1e-5, "o");
  expect_close(lse2, lse2_ref, 2e-6, "lse2");

  // Backward, from a strided grad_o.
  const at::Tensor grad_o = paired_view(c, c.value_dim);
  at::Tensor delta = poisoned(lse2);
  at::Tensor dq = at::zeros({c.batch, c.pairs, c.heads, c.time, c.head_dim}, f32);  // added to
  at::Tensor dk = poisoned(dq);
  at::Tensor dv = poisoned(at::empty({c.batch, c.heads, c.time, c.value_dim}, like_q));
  kernels::coupled_attention_backward_cuda(element_type(q), in, o.data_ptr(), grad_o.data_ptr(),
                                           paired_strides(grad_o), lse2.data_ptr<float>(), delta.data_ptr<float>(),
                                           dq.data_ptr<float>(), dk.data_ptr<float>(), dv.data_ptr(), nullptr);
  (o_ref * grad_o.to(at::kDouble)).sum().backward();
  // dq and dk carry the softmax backward's cancellation p (dp - delta):
  // measured 6.5e-5 in fp32, against 7.7e-7 for dv.
  const double tol = bf16 ? 2.5e-2 : 2e-4;
  expect_close(delta, (o.to(at::kDouble) * grad_o.to(at::kDouble)).sum(-1), 1e-6, "delta");
  std::vector<at::Tensor> dq_ref, dk_ref;
  for (int64_t p = 0; p < c.pairs; ++p) {
    dq_ref.push_back(q_coupled[p].grad());
    dk_ref.push_back(k_coupled[p].grad());
  }
  expect_close(dq, at::stack(dq_ref, 1), tol, "dq (of the coupled q)");
  expect_close(dk, at::stack(dk_ref, 1), tol, "dk (of the coupled k)");
  expect_close(dv, vd.grad(), bf16 ? 1e-2 : 3e-6, "dv");
}

TEST(EmulatedFlashAttentionLimits, ShapesBeyondTheSharedMemoryAreUnsupported) {
  // head dim 128, hidden 16, 3 steps: 242,880 bytes for the backward, over the 232,448 a block gets.
  EXPECT_GT(kernels::coupled_attention_smem_bytes(128, 128, 16, 3), device().smem_optin);
  EXPECT_FALSE(kernels::coupled_attention_supported(128, 128, 16, 3));
  EXPECT_TRUE(kernels::coupled_attention_supported(128, 128, 16, 2));
  // Differential attention at head dim 128: its backward reads the weights from global memory to fit,
  // while its forward packs them (8 steps of hidden 16 are then too many).
  EXPECT_TRUE(kernels::coupled_attention_supported(128, 256, 16, 2));
  EXPECT_FALSE(kernels::coupled_attention_supported(128, 256, 16, 8));
}

// Times over one and several 64-row tiles, with a partial last tile.
const AttentionCase kCases[] = {
    {"vanilla_d64_r8_rope", 1, 1, 2, 70, 64, 64, 8, 2, false, false, true, at::kFloat},
    {"vanilla_d128_r16_shared", 1, 1, 2, 40, 128, 128, 16, 2, false, true, false, at::kFloat},
    {"vanilla_d64_r8_3steps", 1, 1, 2, 64, 64, 64, 8, 3, false, false, true, at::kFloat},
    {"vanilla_d64_r8_1step", 2, 1, 1, 33, 64, 64, 8, 1, false, false, true, at::kFloat},
    {"vanilla_d64_r8_one_token", 1, 1, 2, 1, 64, 64, 8, 2, false, false, true, at::kFloat},
    {"vanilla_d128_r8_three_tiles", 1, 1, 1, 192, 128, 128, 8, 2, false, false, true, at::kFloat},
    {"diff_d64_separate_pairs_rope", 2, 2, 2, 65, 64, 128, 8, 2, true, false, true, at::kFloat},
    {"diff_d64_shared_pairs", 1, 2, 1, 130, 64, 128, 8, 2, false, false, false, at::kFloat},
    {"diff_d128_separate_pairs_rope", 2, 2, 1, 70, 128, 256, 8, 2, true, false, true, at::kFloat},
    {"diff_d128_r16_3steps_shared", 1, 2, 1, 40, 128, 256, 16, 3, false, true, false, at::kFloat},
    {"bf16_diff_d64_rope", 2, 2, 2, 50, 64, 128, 8, 2, false, false, true, at::kBFloat16},
    {"bf16_diff_d128_rope", 1, 2, 1, 66, 128, 256, 8, 2, false, false, true, at::kBFloat16},
    {"bf16_vanilla_d128_rope", 1, 1, 1, 45, 128, 128, 8, 2, false, false, true, at::kBFloat16},
};

INSTANTIATE_TEST_SUITE_P(Cases, EmulatedFlashAttention,
                         ::testing::Combine(::testing::ValuesIn(kCases), both_run_orders()),
                         case_and_order_name<AttentionCase>);

}  // namespace
}  // namespace cqk::emulation
