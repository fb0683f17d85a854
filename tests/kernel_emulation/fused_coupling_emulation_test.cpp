// kernels/coupling_kernels.cu run on the CPU by the emulator (emulator.h): the
// forward, inverse and backward kernels against reference.h's float64 ATen
// coupling (with QK-norm and RoPE), on fresh random inputs and weights far
// from the identity, outputs poisoned with NaN before each launch.
#include <gtest/gtest.h>

#include <ostream>
#include <stdexcept>
#include <string>

#include "emulator.h"
#include "coupling_kernels.h"
#include "reference.h"
#include "test_support.h"
#include "tools/check_support.h"

namespace cqk::emulation {
namespace {

using fused_check::poisoned;
using fused_check::TokensPerBlock;

struct CouplingCase {
  const char* name;
  int64_t batch, heads, time, head_dim, hidden;
  int steps;
  bool shared, rope, qk_norm;
  enum Layout {
    kContiguous,
    kFused,   // q, k and their gradients: views into a fused [batch, time, 3, heads, D] projection
    kQFused,  // q fused, k contiguous (grouped-query attention's expanded k)
  } layout;
  at::ScalarType dtype;
  int64_t tokens_per_block = 0;  // $CQK_FUSED_TOKENS_PER_BLOCK; 0: the launchers' choice
};

std::ostream& operator<<(std::ostream& os, const CouplingCase& c) { return os << c.name; }

constexpr float kClamp = 2.0f;
constexpr float kEps = 1e-5f;

// Two [batch, heads, time, D] tensors laid out as the case says.
std::pair<at::Tensor, at::Tensor> random_pair(const CouplingCase& c) {
  const auto options = at::TensorOptions().dtype(c.dtype);
  const at::Tensor fused = at::randn({c.batch, c.time, 3, c.heads, c.head_dim}, options);
  const at::Tensor contiguous = at::randn({c.batch, c.heads, c.time, c.head_dim}, options);
  const at::Tensor fused_q = fused.select(2, 0).permute({0, 2, 1, 3});
  const at::Tensor fused_k = fused.select(2, 1).permute({0, 2, 1, 3});
  switch (c.layout) {
    case CouplingCase::kFused: return {fused_q, fused_k};
    case CouplingCase::kQFused: return {fused_q, contiguous};
    default: return {fused_q.contiguous(), contiguous};
  }
}

struct CouplingProblem {
  CouplingWeights weights;
  std::vector<int64_t> group_of_head;
  at::Tensor norm_q, norm_k, cos, sin;  // undefined when off
  kernels::AfterCoupling after;
  kernels::CouplingShape shape;
};

CouplingProblem make_problem(const CouplingCase& c) {
  CouplingProblem s;
  s.weights = random_coupling(c.steps, c.shared ? 1 : c.heads, c.head_dim, c.hidden);
  for (int64_t h = 0; h < c.heads; ++h) s.group_of_head.push_back(c.shared ? 0 : h);
  if (c.qk_norm) {
    s.norm_q = 1.0 + 0.2 * at::randn({c.head_dim});
    s.norm_k = 1.0 + 0.2 * at::randn({c.head_dim});
    s.after.norm = {s.norm_q.data_ptr<float>(), s.norm_k.data_ptr<float>(), kEps};
  }
  if (c.rope) {
    std::tie(s.cos, s.sin) = rope_tables(c.time, c.head_dim);
    s.after.rope = {s.cos.data_ptr<float>(), s.sin.data_ptr<float>()};
  }
  s.shape = {c.batch, c.heads, c.time, c.head_dim, c.hidden};
  return s;
}

// The attention's "coupling -> QK-norm -> RoPE" in float64.
at::Tensor reference_after(const at::Tensor& x, const at::Tensor& norm, const CouplingProblem& s, bool qk_norm,
                           bool rope) {
  at::Tensor y = x;
  if (qk_norm) y = reference_rms_norm(y, norm, kEps);
  if (rope) y = reference_rope(y, s.cos, s.sin);
  return y;
}

// About 3x the largest error measured over the cases (2026-12-03): fp32
// 5.4e-7 forward, 2.6e-6 gradients; bf16 2.4e-3 forward, 1.4e-2 gradients
// (the weight gradients sum rounded bf16 terms).
// Beyond 5 steps the backward's inputs, rebuilt by the inverse from the
// outputs step by step, carry float32 rounding amplified by each step's
// exp(+-s) (clamped at e^2 here): the gradients' error grows toward step 0,
// about 5x per step (measured 4.9e-5 at 6 steps, 1.0e-3 at 8, both in step
// 0's dW1), while the forward stays at 5e-7. Kernel and ATen path alike
// recompute from the inverse; the kMaxSteps cases check the loops, not this.
double tolerance(const CouplingCase& c, bool gradient) {
  if (c.dtype == at::kBFloat16) return gradient ? 4e-2 : 8e-3;
  if (gradient && c.steps > 5) return 3e-3;
  return gradient ? 1e-5 : 2e-6;
}

class EmulatedCoupling : public ::testing::TestWithParam<std::tuple<CouplingCase, RunOrder>> {};

TEST_P(EmulatedCoupling, ForwardAndBackwardMatchFloat64Autograd) {
  const auto& [c, order] = GetParam();
  const ScopedRunOrder run_order(order);
  const TokensPerBlock tokens_per_block(c.tokens_per_block);
  at::manual_seed(7);
  CouplingProblem s = make_problem(c);
  auto [q, k] = random_pair(c);
  const auto dense = at::TensorOptions().dtype(c.dtype);
  const std::vector<int64_t> sizes{c.batch, c.heads, c.time, c.head_dim};
  at::Tensor q_out = poisoned(at::empty(sizes, dense)), k_out = poisoned(q_out);
  at::Tensor q_coupled, k_coupled;
  if (c.qk_norm) {
    q_coupled = poisoned(q_out);
    k_coupled = poisoned(q_out);
    s.after.q_coupled = q_coupled.data_ptr();
    s.after.k_coupled = k_coupled.data_ptr();
  }
  const auto params = params_of(s.weights, c.shared, kClamp);
  const int64_t launches = launch_count();
  kernels::affine_coupling_forward_cuda(element_type(q), q.data_ptr(), row_strides(q), k.data_ptr(), row_strides(k),
                                        q_out.data_ptr(), k_out.data_ptr(), s.shape, params, s.after, nullptr);
  EXPECT_EQ(launch_count(), launches + 1);

  // The reference, from the same (possibly bf16-rounded) inputs.
  const at::Tensor qd = q.to(at::kDouble).detach().set_requires_grad(true);
  const at::Tensor kd = k.to(at::kDouble).detach().set_requires_grad(true);
  const CouplingWeights wd = to_double(s.weights, /*requires_grad=*/true);
  at::Tensor nq, nk;
  if (c.qk_norm) {
    nq = s.norm_q.to(at::kDouble).set_requires_grad(true);
    nk = s.norm_k.to(at::kDouble).set_requires_grad(true);
  }
  const auto [qc, kc] = reference_coupling(qd, kd, wd, s.group_of_head, kClamp);
  const at::Tensor q_ref = reference_after(qc, nq, s, c.qk_norm, c.rope);
  const at::Tensor k_ref = reference_after(kc, nk, s, c.qk_norm, c.rope);
  const double tol = tolerance(c, /*gradient=*/false);
  expect_close(q_out, q_ref, tol, "q_out");
  expect_close(k_out, k_ref, tol, "k_out");
  if (c.qk_norm) {
    expect_close(q_coupled, qc, tol, "q_coupled");
    expect_close(k_coupled, kc, tol, "k_coupled");
  }

  // Backward from (possibly strided) output gradients.
  auto [grad_q, grad_k] = random_pair(c);
  at::Tensor dq = poisoned(q_out), dk = poisoned(q_out);
  CouplingWeights grads = zeros_like(s.weights);
  at::Tensor norm_grad_q = at::zeros({c.head_dim}), norm_grad_k = at::zeros({c.head_dim});
  kernels::AfterCoupling after = s.after;
  after.q_coupled = after.k_coupled = nullptr;  // not read by the backward
  const at::Tensor& saved_q = c.qk_norm ? q_coupled : q_out;
  const at::Tensor& saved_k = c.qk_norm ? k_coupled : k_out;
  kernels::affine_coupling_backward_cuda(
      element_type(q), saved_q.data_ptr(), saved_k.data_ptr(), grad_q.data_ptr(), row_strides(grad_q),
      grad_k.data_ptr(), row_strides(grad_k), dq.data_ptr(), dk.data_ptr(), s.shape, params, grads_of(grads), after,
      {norm_grad_q.data_ptr<float>(), norm_grad_k.data_ptr<float>()}, nullptr);

  (q_ref * grad_q.to(at::kDouble) + k_ref * grad_k.to(at::kDouble)).sum().backward();
  const double gtol = tolerance(c, /*gradient=*/true);
  expect_close(dq, qd.grad(), gtol, "dq");
  expect_close(dk, kd.grad(), gtol, "dk");
  for (int i = 0; i < c.steps; ++i) {
    const std::string step = " of step " + std::to_string(i);
    expect_close(grads.w1[i], wd.w1[i].grad(), gtol, "dw1" + step);
    expect_close(grads.b1[i], wd.b1[i].grad(), gtol, "db1" + step);
    expect_close(grads.w2[i], wd.w2[i].grad(), gtol, "dw2" + step);
    expect_close(grads.b2[i], wd.b2[i].grad(), gtol, "db2" + step);
  }
  if (c.qk_norm) {
    expect_close(norm_grad_q, nq.grad(), gtol, "QK-norm dw_q");
    expect_close(norm_grad_k, nk.grad(), gtol, "QK-norm dw_k");
  }
}

// The inverse is of the coupling alone (no QK-norm or RoPE).
class EmulatedCouplingInverse : public ::testing::TestWithParam<std::tuple<CouplingCase, RunOrder>> {};

TEST_P(EmulatedCouplingInverse, UndoesTheForward) {
  const auto& [c, order] = GetParam();
  const ScopedRunOrder run_order(order);
  const TokensPerBlock tokens_per_block(c.tokens_per_block);
  at::manual_seed(11);
  const CouplingProblem s = make_problem(c);
  auto [q, k] = random_pair(c);
  const auto params = params_of(s.weights, c.shared, kClamp);
  const std::vector<int64_t> sizes{c.batch, c.heads, c.time, c.head_dim};
  at::Tensor q_out = poisoned(at::empty(sizes, q.options())), k_out = poisoned(q_out);
  kernels::affine_coupling_forward_cuda(element_type(q), q.data_ptr(), row_strides(q), k.data_ptr(), row_strides(k),
                                        q_out.data_ptr(), k_out.data_ptr(), s.shape, params, {}, nullptr);
  at::Tensor q_back = poisoned(q_out), k_back = poisoned(q_out);
  kernels::affine_coupling_inverse_cuda(element_type(q), q_out.data_ptr(), row_strides(q_out), k_out.data_ptr(),
                                        row_strides(k_out), q_back.data_ptr(), k_back.data_ptr(), s.shape, params,
                                        nullptr);
  // bf16: the forward's rounded outputs go back through exp(-s): a few bf16
  // steps (measured 1.4e-2; fp32 2.2e-6). Beyond 5 steps the rounding is
  // amplified step by step, as in tolerance() (measured 4.5e-4 at 8 steps).
  const double tol = c.dtype == at::kBFloat16 ? 3e-2 : c.steps > 5 ? 1.5e-3 : 6e-6;
  expect_close(q_back, q, tol, "inverse(forward(q))");
  expect_close(k_back, k, tol, "inverse(forward(k))");
}

// The launchers' own checks, which run before any kernel: each bad argument
// gets std::invalid_argument naming it, and nothing is launched.
TEST(EmulatedCouplingLaunchers, RefuseBadArgumentsBeforeLaunching) {
  const CouplingCase c{"d64", 1, 2, 8, 64, 8, 2, false, false, false, CouplingCase::kContiguous, at::kFloat};
  const CouplingProblem s = make_problem(c);
  auto [q, k] = random_pair(c);
  at::Tensor q_out = at::empty_like(q), k_out = at::empty_like(k);
  const auto params = params_of(s.weights, false, kClamp);
  const int64_t launches = launch_count();
  auto forward = [&](const void* q_data, const kernels::CouplingShape& shape, const kernels::AffineCouplingParams& p,
                     const kernels::AfterCoupling& after) {
    kernels::affine_coupling_forward_cuda(element_type(q), q_data, row_strides(q), k.data_ptr(), row_strides(k),
                                          q_out.data_ptr(), k_out.data_ptr(), shape, p, after, nullptr);
  };
  auto message = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "(no error)";
  };
  const float* misaligned = q.data_ptr<float>() + 1;
  EXPECT_EQ(message([&] { forward(misaligned, s.shape, params, {}); }),
            "fused coupling: rows of q must start on 16-byte boundaries (make it contiguous)");
  kernels::CouplingShape head_dim_32 = s.shape;
  head_dim_32.head_dim = 32;
  EXPECT_NE(message([&] { forward(q.data_ptr(), head_dim_32, params, {}); }).find("unsupported head_dim 32"),
            std::string::npos);
  kernels::AffineCouplingParams missing = params;
  missing.w2[1] = nullptr;
  EXPECT_EQ(message([&] { forward(q.data_ptr(), s.shape, missing, {}); }),
            "fused coupling: missing weights of step 1");
  kernels::AfterCoupling cos_only;
  cos_only.rope.cos = params.b2[0];
  EXPECT_EQ(message([&] { forward(q.data_ptr(), s.shape, params, cos_only); }),
            "fused coupling: RoPE needs both tables, cos and sin");
  for (const char* bad : {"12x", "0", "-4"}) {
    setenv("CQK_FUSED_TOKENS_PER_BLOCK", bad, 1);
    EXPECT_EQ(message([&] { forward(q.data_ptr(), s.shape, params, {}); }),
              std::string("CQK_FUSED_TOKENS_PER_BLOCK must be a positive integer, got '") + bad + "'");
  }
  unsetenv("CQK_FUSED_TOKENS_PER_BLOCK");
  EXPECT_EQ(launch_count(), launches);
}

// Under no-grad the attention asks for no coupled outputs (q_coupled null):
// the QK-norm forward then writes the same q_out and k_out without them.
TEST(EmulatedCouplingLaunchers, QKNormForwardWithoutKeptOutputs) {
  const CouplingCase c{"d64_qknorm_rope", 2, 2, 21, 64, 8, 2, false, true, true, CouplingCase::kFused, at::kFloat};
  const CouplingProblem s = make_problem(c);
  auto [q, k] = random_pair(c);
  const auto params = params_of(s.weights, false, kClamp);
  auto run = [&](bool keep) {
    at::Tensor q_out = poisoned(q), k_out = poisoned(k), q_coupled = poisoned(q), k_coupled = poisoned(k);
    kernels::AfterCoupling after = s.after;
    if (keep) after.q_coupled = q_coupled.data_ptr(), after.k_coupled = k_coupled.data_ptr();
    kernels::affine_coupling_forward_cuda(element_type(q), q.data_ptr(), row_strides(q), k.data_ptr(),
                                          row_strides(k), q_out.data_ptr(), k_out.data_ptr(), s.shape, params, after,
                                          nullptr);
    return std::make_pair(q_out, k_out);
  };
  const auto [q_kept, k_kept] = run(true);
  const auto [q_alone, k_alone] = run(false);
  EXPECT_TRUE(at::equal(q_alone, q_kept));
  EXPECT_TRUE(at::equal(k_alone, k_kept));
}

// Blocks get 32 (D 64) or 16 (D 128) tokens at a time; the emulated device's
// few multiprocessors and the times make groups of several blocks, the last
// one partial; 64 tokens per block makes a block loop over two batches.
const CouplingCase kCases[] = {
    {"d64_r8_rope_fused", 2, 3, 37, 64, 8, 2, false, true, false, CouplingCase::kFused, at::kFloat},
    {"d64_r16_3steps_shared", 2, 2, 45, 64, 16, 3, true, false, false, CouplingCase::kContiguous, at::kFloat},
    {"d64_r8_qknorm_64_per_block", 1, 2, 70, 64, 8, 2, false, false, true, CouplingCase::kContiguous, at::kFloat,
     64},
    {"d64_r16_4steps_qknorm_rope_q_fused", 2, 2, 19, 64, 16, 4, false, true, true, CouplingCase::kQFused,
     at::kFloat},
    {"d64_r8_one_token", 1, 2, 1, 64, 8, 2, false, true, false, CouplingCase::kContiguous, at::kFloat},
    {"d128_r8_qknorm_rope_fused", 1, 2, 33, 128, 8, 2, false, true, true, CouplingCase::kFused, at::kFloat},
    {"d128_r16_1step", 2, 2, 20, 128, 16, 1, false, false, false, CouplingCase::kContiguous, at::kFloat},
    // Up to the most steps the launchers take (AffineCouplingParams::kMaxSteps).
    {"d64_r8_5steps_rope", 1, 2, 13, 64, 8, 5, false, true, false, CouplingCase::kContiguous, at::kFloat},
    {"d64_r8_8steps_rope", 1, 2, 13, 64, 8, 8, false, true, false, CouplingCase::kContiguous, at::kFloat},
    {"bf16_d64_r8_rope_fused", 2, 2, 29, 64, 8, 2, false, true, false, CouplingCase::kFused, at::kBFloat16},
    {"bf16_d128_r8_qknorm_rope", 1, 2, 26, 128, 8, 2, false, true, true, CouplingCase::kContiguous, at::kBFloat16},
};

const CouplingCase kInverseCases[] = {
    {"d64_r16_3steps_shared_fused", 2, 2, 45, 64, 16, 3, true, false, false, CouplingCase::kFused, at::kFloat, 64},
    {"d128_r8_2steps", 2, 2, 20, 128, 8, 2, false, false, false, CouplingCase::kContiguous, at::kFloat},
    {"bf16_d64_r8_2steps", 1, 3, 40, 64, 8, 2, false, false, false, CouplingCase::kQFused, at::kBFloat16},
    {"d64_r8_8steps", 1, 2, 13, 64, 8, 8, false, false, false, CouplingCase::kContiguous, at::kFloat},
};

INSTANTIATE_TEST_SUITE_P(Cases, EmulatedCoupling, ::testing::Combine(::testing::ValuesIn(kCases), both_run_orders()),
                         case_and_order_name<CouplingCase>);
INSTANTIATE_TEST_SUITE_P(Cases, EmulatedCouplingInverse,
                         ::testing::Combine(::testing::ValuesIn(kInverseCases), both_run_orders()),
                         case_and_order_name<CouplingCase>);

}  // namespace
}  // namespace cqk::emulation
