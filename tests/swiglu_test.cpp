#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "cqk/swiglu.h"
#include "simd/swiglu_cpu.h"
#include "tools/tensor_compare.h"

// cqk::swiglu against silu(gate) * up through autograd in float64: the value
// and both gradients, on fresh random inputs.
namespace {

using cqk::testing::max_relative_error;

struct Result {
  at::Tensor out, grad_gate, grad_up;
};

// swiglu or the reference on copies of the inputs, backpropagating grad_out.
template <typename F>
Result run(F&& f, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& grad_out) {
  auto g = gate.detach().clone().requires_grad_(true), u = up.detach().clone().requires_grad_(true);
  const auto out = f(g, u);
  out.backward(grad_out.to(out.scalar_type()));
  return {out.detach(), g.grad(), u.grad()};
}

Result fused(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& grad_out) {
  return run([](const at::Tensor& g, const at::Tensor& u) { return cqk::swiglu(g, u); }, gate, up, grad_out);
}

Result float64_reference(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& grad_out) {
  return run([](const at::Tensor& g, const at::Tensor& u) { return at::silu(g) * u; }, gate.to(at::kDouble),
             up.to(at::kDouble), grad_out);
}

void expect_matches_float64(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& grad_out) {
  const auto got = fused(gate, up, grad_out), want = float64_reference(gate, up, grad_out);
  EXPECT_LT(max_relative_error(got.out, want.out), 1e-6);
  EXPECT_LT(max_relative_error(got.grad_gate, want.grad_gate), 1e-6);
  EXPECT_LT(max_relative_error(got.grad_up, want.grad_up), 1e-6);
}

}  // namespace

TEST(SwiGLU, MatchesFloat64OnFreshRandomInputs) {
  if (!cqk::cpu::swiglu_supported()) GTEST_SKIP() << "this CPU has no AVX2/FMA: swiglu is at::silu(gate) * up";
  for (const int64_t n : {1, 7, 1001, 2048 * 384 + 5}) {  // vector tails, and enough for both threads
    auto gen = at::make_generator<at::CPUGeneratorImpl>(n);
    const auto gate = at::randn({n}, gen) * 4.0, up = at::randn({n}, gen), grad = at::randn({n}, gen);
    SCOPED_TRACE(n);
    expect_matches_float64(gate, up, grad);
  }
}

TEST(SwiGLU, LargeGatesStayFinite) {
  if (!cqk::cpu::swiglu_supported()) GTEST_SKIP() << "this CPU has no AVX2/FMA";
  // exp(-gate) overflows float32 below -88.7: silu is 0 there, and its derivative 0.
  const auto gate = at::tensor({-500.0f, -100.0f, -89.0f, 0.0f, 89.0f, 500.0f}), up = at::ones({6});
  const auto got = fused(gate, up, at::ones({6}));
  for (const auto& t : {got.out, got.grad_gate, got.grad_up}) EXPECT_TRUE(at::isfinite(t).all().item<bool>()) << t;
  const auto want = float64_reference(gate, up, at::ones({6}));
  EXPECT_LT(max_relative_error(got.out, want.out), 1e-6);
  EXPECT_LT(max_relative_error(got.grad_gate, want.grad_gate), 1e-6);
}

TEST(SwiGLU, StridedInputsAndTheModelsShapes) {
  if (!cqk::cpu::swiglu_supported()) GTEST_SKIP() << "this CPU has no AVX2/FMA";
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const auto gate = at::randn({4, 64, 96}, gen).transpose(1, 2), up = at::randn({4, 96, 64}, gen);
  expect_matches_float64(gate, up, at::randn({4, 96, 64}, gen));
}

TEST(SwiGLU, OtherInputsTakeTheAtenOps) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  const auto gate = at::randn({3, 5}, gen), up = at::randn({3, 5}, gen), grad = at::randn({3, 5}, gen);
  const auto aten = [](const at::Tensor& g, const at::Tensor& u) { return at::silu(g) * u; };
  // bfloat16, and broadcasting shapes, are ATen's: the same ops give the same bits.
  const auto bf16 = run(cqk::swiglu, gate.to(at::kBFloat16), up.to(at::kBFloat16), grad);
  const auto bf16_aten = run(aten, gate.to(at::kBFloat16), up.to(at::kBFloat16), grad);
  EXPECT_TRUE(at::equal(bf16.out, bf16_aten.out));
  EXPECT_TRUE(at::equal(bf16.grad_gate, bf16_aten.grad_gate));
  const auto row = up.slice(0, 0, 1);
  EXPECT_TRUE(at::equal(cqk::swiglu(gate, row), aten(gate, row)));
  // The switch off: ATen for float32 too.
  cqk::set_fused_swiglu_enabled(false);
  const auto off = run(cqk::swiglu, gate, up, grad), reference = run(aten, gate, up, grad);
  cqk::set_fused_swiglu_enabled(true);
  EXPECT_TRUE(at::equal(off.out, reference.out));
  EXPECT_TRUE(at::equal(off.grad_gate, reference.grad_gate));
  EXPECT_TRUE(at::equal(off.grad_up, reference.grad_up));
}
