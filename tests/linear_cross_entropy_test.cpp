#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>

#include <cmath>
#include <stdexcept>

#include "cqk/linear_cross_entropy.h"

// The fused head + loss against cross_entropy(hidden @ weight^T) in float64
// through autograd: the value and both gradients, ignored targets included.
namespace {

struct Problem {
  at::Tensor hidden, weight, targets;
};

Problem random_problem(int64_t n, int64_t d, int64_t vocab, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Problem p;
  p.hidden = at::randn({n, d}, gen, at::kFloat);
  p.weight = at::randn({vocab, d}, gen, at::kFloat) * 0.7;
  p.targets = at::randint(vocab, {n}, gen, at::kLong);
  return p;
}

struct LossAndGradients {
  at::Tensor loss, grad_hidden, grad_weight;
};

LossAndGradients fused(const Problem& p, int64_t ignore_index = cqk::kIgnoredTarget) {
  auto hidden = p.hidden.clone().requires_grad_(true), weight = p.weight.clone().requires_grad_(true);
  auto loss = cqk::linear_cross_entropy(hidden, weight, p.targets, ignore_index);
  loss.backward();
  return {loss.detach(), hidden.grad(), weight.grad()};
}

LossAndGradients reference(const Problem& p, int64_t ignore_index = cqk::kIgnoredTarget) {
  auto hidden = p.hidden.to(at::kDouble).requires_grad_(true), weight = p.weight.to(at::kDouble).requires_grad_(true);
  auto loss = at::cross_entropy_loss(at::matmul(hidden, weight.t()), p.targets, {}, at::Reduction::Mean, ignore_index);
  loss.backward();
  return {loss.detach(), hidden.grad(), weight.grad()};
}

void expect_close(const at::Tensor& actual, const at::Tensor& expected, double tolerance, const char* what) {
  const double error = (actual.to(at::kDouble) - expected).abs().max().item<double>();
  const double scale = expected.abs().max().item<double>();
  EXPECT_LE(error, tolerance * std::max(scale, 1.0)) << what;
}

}  // namespace

TEST(LinearCrossEntropy, MatchesFloat64CrossEntropyOfTheLogitsAndItsGradients) {
  for (const uint64_t seed : {1, 2, 3}) {
    const auto p = random_problem(37, 16, 53, seed);
    const auto got = fused(p), want = reference(p);
    expect_close(got.loss, want.loss, 1e-6, "loss");
    expect_close(got.grad_hidden, want.grad_hidden, 1e-6, "grad hidden");
    expect_close(got.grad_weight, want.grad_weight, 1e-6, "grad weight");
  }
}

TEST(LinearCrossEntropy, IgnoredTargetsAddNothingToTheLossOrTheGradients) {
  auto p = random_problem(40, 8, 29, 4);
  p.targets.index_put_({at::arange(0, 40, 3)}, -100);
  const auto got = fused(p), want = reference(p);
  expect_close(got.loss, want.loss, 1e-6, "loss");
  expect_close(got.grad_hidden, want.grad_hidden, 1e-6, "grad hidden");
  expect_close(got.grad_weight, want.grad_weight, 1e-6, "grad weight");
  // A row whose target is ignored gets no gradient at all.
  EXPECT_EQ(got.grad_hidden[0].abs().max().item<float>(), 0.0f);
  // Another ignore index works the same way.
  auto q = random_problem(12, 8, 29, 5);
  q.targets[3] = 7;
  const auto got7 = fused(q, 7), want7 = reference(q, 7);
  expect_close(got7.loss, want7.loss, 1e-6, "loss, ignore_index 7");
  expect_close(got7.grad_weight, want7.grad_weight, 1e-6, "grad weight, ignore_index 7");
}

TEST(LinearCrossEntropy, LargeLogitsStayFinite) {
  // exp of the target's shifted logit underflows in float32 here; the loss must not.
  auto p = random_problem(8, 4, 11, 6);
  p.weight = p.weight * 400.0;
  const auto got = fused(p), want = reference(p);
  EXPECT_TRUE(std::isfinite(got.loss.item<double>()));
  expect_close(got.loss, want.loss, 1e-5, "loss with large logits");
  expect_close(got.grad_hidden, want.grad_hidden, 1e-5, "grad hidden with large logits");
}

TEST(LinearCrossEntropy, AllTargetsIgnoredGivesNaNAsCrossEntropyDoes) {
  auto p = random_problem(5, 4, 7, 7);
  p.targets.fill_(-100);
  EXPECT_TRUE(std::isnan(fused(p).loss.item<double>()));
  EXPECT_TRUE(std::isnan(reference(p).loss.item<double>()));
}

TEST(LinearCrossEntropy, ASecondBackwardThroughARetainedGraphGivesTheSameGradients) {
  const auto p = random_problem(9, 6, 13, 8);
  auto hidden = p.hidden.clone().requires_grad_(true), weight = p.weight.clone().requires_grad_(true);
  auto loss = cqk::linear_cross_entropy(hidden, weight, p.targets);
  const auto first = torch::autograd::grad({loss}, {hidden, weight}, {}, /*retain_graph=*/true);
  const auto second = torch::autograd::grad({loss * 2.0}, {hidden, weight});
  EXPECT_TRUE(at::allclose(second[0], first[0] * 2.0));
  EXPECT_TRUE(at::allclose(second[1], first[1] * 2.0));
}

TEST(LinearCrossEntropy, UnderBf16AutocastTheMatmulsRunInBf16AndGradientsKeepTheParameterType) {
  const auto p = random_problem(16, 32, 40, 9);
  auto hidden = p.hidden.clone().requires_grad_(true), weight = p.weight.clone().requires_grad_(true);
  at::Tensor loss;
  {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    loss = cqk::linear_cross_entropy(hidden, weight, p.targets);
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
  }
  loss.backward();
  const auto want = reference(p);
  EXPECT_EQ(loss.scalar_type(), at::kFloat);
  EXPECT_EQ(hidden.grad().scalar_type(), at::kFloat);
  EXPECT_EQ(weight.grad().scalar_type(), at::kFloat);
  // bf16 keeps 8 bits of mantissa: the logits of d = 32 products are good to about 1%.
  expect_close(loss, want.loss, 2e-2, "bf16 loss");
  expect_close(hidden.grad(), want.grad_hidden, 5e-2, "bf16 grad hidden");
  // float32 logits would agree with float64 to about 1e-7; bf16 ones cannot.
  EXPECT_GT((loss.to(at::kDouble) - want.loss).abs().item<double>(), 1e-4) << "the matmul did not run in bf16";
}

TEST(LinearCrossEntropy, RejectsMismatchedShapesWithTheShapesInTheMessage) {
  const auto p = random_problem(4, 8, 10, 10);
  try {
    cqk::linear_cross_entropy(p.hidden, p.weight.narrow(1, 0, 5), p.targets);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[4, 8] and [10, 5]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cqk::linear_cross_entropy(p.hidden, p.weight, p.targets.narrow(0, 0, 3)), std::invalid_argument);
  EXPECT_THROW(cqk::linear_cross_entropy(p.hidden, p.weight, p.targets.to(at::kInt)), std::invalid_argument);
}
