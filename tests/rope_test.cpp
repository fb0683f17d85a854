#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/cuda.h>

#include <cmath>

#include "cqk/rope.h"
#include "ops/rope_kernel.h"
#include "simd/rope_cpu.h"
#include "tools/tensor_compare.h"

// apply_rope's CPU kernel against the ATen formula in float64 (apply_rope
// itself on float64 tensors, which take the ATen ops), through autograd.
namespace {

using cqk::testing::max_relative_error;

struct Result {
  at::Tensor y, grad_x;
};

Result rope(const at::Tensor& x, const at::Tensor& grad_y, int64_t offset) {
  auto xi = x.detach().clone().requires_grad_(true);  // the clone keeps x's strides
  const auto y = cqk::apply_rope(xi, 10000.0, offset);
  y.backward(grad_y.to(y.scalar_type()));
  return {y.detach(), xi.grad()};
}

void expect_matches_float64(const at::Tensor& x, const at::Tensor& grad_y, int64_t offset) {
  const auto got = rope(x, grad_y, offset), want = rope(x.to(at::kDouble), grad_y, offset);
  EXPECT_LT(max_relative_error(got.y, want.y), 1e-6);
  EXPECT_LT(max_relative_error(got.grad_x, want.grad_x), 1e-6);
}

}  // namespace

TEST(Rope, KernelMatchesFloat64OnFreshRandomInputs) {
  if (!cqk::cpu::rope_supported()) GTEST_SKIP() << "this CPU has no AVX2/FMA: apply_rope runs the ATen ops";
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  for (const auto& shape : {std::vector<int64_t>{1, 1, 1, 2}, {2, 3, 37, 64}, {1, 2, 300, 32}, {3, 1, 5, 10}}) {
    SCOPED_TRACE(c10::str(shape));
    expect_matches_float64(at::randn(shape, gen), at::randn(shape, gen), 0);
    expect_matches_float64(at::randn(shape, gen), at::randn(shape, gen), 1000);  // positions after a cache
  }
}

TEST(Rope, KernelReadsTheHeadSplitViewInPlace) {
  if (!cqk::cpu::rope_supported()) GTEST_SKIP() << "this CPU has no AVX2/FMA";
  auto gen = at::make_generator<at::CPUGeneratorImpl>(6);
  // [batch, heads, time, dim] seen through a [batch, time, heads, dim] projection, as attention splits heads.
  const auto x = at::randn({2, 17, 4, 64}, gen).transpose(1, 2);
  ASSERT_FALSE(x.clone().is_contiguous());
  expect_matches_float64(x, at::randn({2, 4, 17, 64}, gen), 0);
}

TEST(Rope, KernelPreservesNormsAndTheSwitchGivesTheAtenOps) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const auto x = at::randn({2, 2, 9, 16}, gen), grad = at::randn({2, 2, 9, 16}, gen);
  // A rotation of each (i, i + half) pair: the norm of every row is kept.
  const auto y = cqk::apply_rope(x, 10000.0);
  EXPECT_TRUE(at::allclose(y.norm(2, -1), x.norm(2, -1), 1e-5, 1e-6));
  const auto on = rope(x, grad, 3);
  cqk::set_fused_rope_enabled(false);
  const auto off = rope(x, grad, 3);
  cqk::set_fused_rope_enabled(true);
  EXPECT_LT(max_relative_error(on.y, off.y.to(at::kDouble)), 1e-6);
  EXPECT_LT(max_relative_error(on.grad_x, off.grad_x.to(at::kDouble)), 1e-6);
  // bf16 takes the ATen ops in float32.
  const auto bf16 = rope(x.to(at::kBFloat16), grad, 3);
  EXPECT_EQ(bf16.y.scalar_type(), at::kBFloat16);
  EXPECT_LT(max_relative_error(bf16.y, off.y.to(at::kDouble)), 1e-2);
}

// The base model's RoPE on CUDA: one pass each way (kernels/rope_kernels.cu),
// float32 and bf16, the head-split view read in place; against apply_rope in
// float64 (the ATen ops on the GPU). The kernel itself is also checked on the
// CPU by the emulator (tests/kernel_emulation/rope_emulation_test.cpp).
TEST(FusedRope, CudaKernelMatchesFloat64ForwardAndBackward) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: the CUDA RoPE kernel needs a GPU (scripts/gpu_check.sh)";
  at::manual_seed(8);
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const auto x = at::randn({2, 130, 4, 64}, cuda).transpose(1, 2), grad = at::randn({2, 4, 130, 64}, cuda);
  // Else apply_rope takes the ATen ops and this compares ATen with itself.
  ASSERT_TRUE(cqk::ops::rope_kernel_applies(x)) << "CQK_FUSED_ROPE=0, or the CUDA RoPE kernel is not compiled in or refuses the shape";
  ASSERT_TRUE(cqk::ops::rope_kernel_applies(x.to(at::kBFloat16)));
  const auto want = rope(x.to(at::kDouble), grad, 0);
  const auto fp32 = rope(x, grad, 0);
  EXPECT_LT(max_relative_error(fp32.y, want.y), 1e-6);
  EXPECT_LT(max_relative_error(fp32.grad_x, want.grad_x), 1e-6);
  // bf16 in and out, float32 inside: one rounding of each output.
  const auto bf16 = rope(x.to(at::kBFloat16), grad, 0);
  EXPECT_EQ(bf16.y.scalar_type(), at::kBFloat16);
  EXPECT_LT(max_relative_error(bf16.y, want.y), 1e-2);
  EXPECT_LT(max_relative_error(bf16.grad_x, want.grad_x), 1e-2);
}
