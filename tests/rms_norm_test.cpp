#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "cqk/rms_norm.h"
#include "simd/rms_norm_cpu.h"
#include "tools/tensor_compare.h"

// RMSNorm's kernel path against the formula through autograd in float64: the
// output and the gradients of x and of the weight, on fresh random inputs.
namespace {

using cqk::testing::max_relative_error;

struct Result {
  at::Tensor y, grad_x, grad_weight;
};

Result module_result(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& grad_y) {
  cqk::RMSNorm norm(weight.numel(), 1e-6);
  {
    at::NoGradGuard no_grad;
    norm->weight.copy_(weight);
  }
  auto xi = x.detach().clone().requires_grad_(true);
  const auto y = norm(xi);
  y.backward(grad_y.to(y.scalar_type()));
  return {y.detach(), xi.grad(), norm->weight.grad()};
}

Result float64_reference(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& grad_y) {
  auto xd = x.to(at::kDouble).requires_grad_(true), wd = weight.to(at::kDouble).requires_grad_(true);
  const auto y = xd * at::rsqrt(xd.pow(2).mean(-1, true) + 1e-6) * wd;
  y.backward(grad_y.to(at::kDouble));
  return {y.detach(), xd.grad(), wd.grad()};
}

void expect_matches_float64(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& grad_y) {
  const auto got = module_result(x, weight, grad_y), want = float64_reference(x, weight, grad_y);
  EXPECT_LT(max_relative_error(got.y, want.y), 1e-6);
  EXPECT_LT(max_relative_error(got.grad_x, want.grad_x), 1e-5);
  EXPECT_LT(max_relative_error(got.grad_weight, want.grad_weight), 1e-5);
}

}  // namespace

TEST(RMSNorm, KernelMatchesFloat64OnFreshRandomInputs) {
  if (!cqk::cpu::rms_norm_supported()) GTEST_SKIP() << "this CPU has no AVX2/FMA: RMSNorm runs the ATen ops";
  const std::vector<int64_t> shapes[] = {{1, 8}, {7, 37}, {2, 33, 128}, {2048, 512}};
  int64_t seed = 1;
  for (const auto& shape : shapes) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed++);
    const int64_t dim = shape.back();
    const auto x = at::randn(shape, gen) * 3.0, weight = at::randn({dim}, gen), grad = at::randn(shape, gen);
    SCOPED_TRACE(c10::str(shape));
    expect_matches_float64(x, weight, grad);
  }
}

TEST(RMSNorm, KernelReadsStridedInputsAndZeroRows) {
  if (!cqk::cpu::rms_norm_supported()) GTEST_SKIP() << "this CPU has no AVX2/FMA";
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  // A [batch, heads, time, dim] view of a [batch, time, heads, dim] tensor, as QK-norm sees it.
  const auto x = at::randn({2, 5, 3, 64}, gen).transpose(1, 2);
  expect_matches_float64(x, at::randn({64}, gen), at::randn({2, 3, 5, 64}, gen));
  // All-zero rows: y = 0 and finite gradients (eps keeps 1 / rms finite).
  auto zeros = at::zeros({3, 16});
  zeros[1] = at::randn({16}, gen);
  const auto got = module_result(zeros, at::ones({16}), at::ones({3, 16}));
  EXPECT_TRUE(at::isfinite(got.grad_x).all().item<bool>());
  expect_matches_float64(zeros, at::ones({16}), at::ones({3, 16}));
}

TEST(RMSNorm, OtherInputsAndTheSwitchTakeTheAtenOps) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(12);
  const auto x = at::randn({4, 32}, gen), weight = at::randn({32}, gen), grad = at::randn({4, 32}, gen);
  // bf16 is normalised in float32 by the ATen ops: within bf16 rounding of float64.
  const auto bf16 = module_result(x.to(at::kBFloat16), weight, grad), want = float64_reference(x, weight, grad);
  EXPECT_EQ(bf16.y.scalar_type(), at::kBFloat16);
  EXPECT_LT(max_relative_error(bf16.y, want.y), 2e-2);
  // The switch off: the ATen ops on float32, still the same function.
  cqk::set_fused_rms_norm_enabled(false);
  const auto off = module_result(x, weight, grad);
  cqk::set_fused_rms_norm_enabled(true);
  const auto on = module_result(x, weight, grad);
  EXPECT_LT(max_relative_error(off.y, want.y), 1e-6);
  EXPECT_LT(max_relative_error(off.grad_x, want.grad_x), 1e-5);
  EXPECT_LT(max_relative_error(on.y, off.y.to(at::kDouble)), 1e-6);
  EXPECT_LT(max_relative_error(on.grad_weight, off.grad_weight.to(at::kDouble)), 1e-5);
}
