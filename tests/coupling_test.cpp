#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>

#include "coupling_math.cuh"
#include "cqk/coupling.h"
#include "gradient_check.h"
#include "tools/tensor_compare.h"

namespace {

using cqk::CouplingKind;
using cqk::CouplingOptions;
using cqk::QKCoupling;
using cqk::testing::max_relative_error;

// Every kind with parameters, from the enum's table: a new kind is tested here without being listed.
const std::vector<CouplingKind> kLearnedKinds = [] {
  std::vector<CouplingKind> kinds;
  for (const auto& name : cqk::coupling_kind_names())
    if (name != "none") kinds.push_back(cqk::parse_coupling_kind(name));
  return kinds;
}();

CouplingOptions options(CouplingKind kind, int64_t heads = 3, int64_t dim = 8) {
  return CouplingOptions(kind, heads, dim).hidden(4);
}

// Replaces every parameter by a non-trivial random value (the zero-initialised
// output layers would make every check pass trivially).
void randomise(QKCoupling& coupling, double scale = 0.3) {
  at::NoGradGuard no_grad;
  for (auto& p : coupling->parameters()) p.copy_(at::randn_like(p) * scale);
}

TEST(Coupling, EveryKindIsExactlyTheIdentityAtInit) {
  at::manual_seed(0);
  const auto q = at::randn({2, 3, 5, 8}), k = at::randn({2, 3, 5, 8});
  for (auto kind : kLearnedKinds) {
    QKCoupling coupling(options(kind));
    const auto [q_out, k_out] = coupling->forward(q, k);
    EXPECT_TRUE(at::equal(q_out, q)) << cqk::to_string(kind);
    EXPECT_TRUE(at::equal(k_out, k)) << cqk::to_string(kind);
  }
}

TEST(Coupling, InverseOfForwardIsTheInputInFloat32And64) {
  for (auto kind : {CouplingKind::Affine, CouplingKind::Dynamics}) {
    for (auto dtype : {at::kFloat, at::kDouble}) {
      at::manual_seed(1);
      QKCoupling coupling(options(kind).steps(4));
      coupling->to(dtype);
      randomise(coupling);
      const auto q = at::randn({2, 3, 7, 8}, dtype), k = at::randn({2, 3, 7, 8}, dtype);
      const auto [q_out, k_out] = coupling->forward(q, k);
      ASSERT_FALSE(at::allclose(q_out, q)) << "the randomised map must not be the identity";
      const auto [q_back, k_back] = coupling->inverse(q_out, k_out);
      const double tolerance = dtype == at::kFloat ? 1e-5 : 1e-12;
      EXPECT_LT(max_relative_error(q_back, q), tolerance) << cqk::to_string(kind);
      EXPECT_LT(max_relative_error(k_back, k), tolerance) << cqk::to_string(kind);
    }
  }
}

TEST(Coupling, NonInvertibleKindsRefuseInverse) {
  const auto q = at::randn({1, 3, 2, 8});
  for (auto opts : {options(CouplingKind::NonInvertible), options(CouplingKind::Uncoupled),
                    options(CouplingKind::Dynamics).integrator(cqk::Integrator::Euler)}) {
    QKCoupling coupling(opts);
    EXPECT_THROW(coupling->inverse(q, q), std::logic_error) << cqk::to_string(opts.kind());
  }
}

TEST(Coupling, GradientsMatchFiniteDifferencesForEveryKind) {
  for (auto kind : kLearnedKinds) {
    for (bool recompute : {true, false}) {
      at::manual_seed(2);
      QKCoupling coupling(options(kind).recompute_from_inverse(recompute));
      coupling->to(at::kDouble);
      randomise(coupling);
      auto q = at::randn({2, 3, 4, 8}, at::kDouble).requires_grad_();
      auto k = at::randn({2, 3, 4, 8}, at::kDouble).requires_grad_();
      std::vector<at::Tensor> inputs{q, k};
      for (const auto& p : coupling->parameters()) inputs.push_back(p);
      const auto result = cqk::testing::check_gradients(
          [&] {
            auto [a, b] = coupling->forward(q, k);
            return at::cat({a, b}, -1);
          },
          inputs);
      EXPECT_TRUE(result.ok) << cqk::to_string(kind) << " recompute=" << recompute << ": " << result.report;
    }
  }
}

TEST(Coupling, RecomputingFromTheInverseGivesTheSameGradients) {
  for (auto kind : {CouplingKind::Affine, CouplingKind::Dynamics}) {
    std::vector<at::Tensor> grads[2];
    for (int recompute = 0; recompute < 2; ++recompute) {
      at::manual_seed(3);
      QKCoupling coupling(options(kind).recompute_from_inverse(recompute == 1));
      coupling->to(at::kDouble);
      randomise(coupling);
      auto q = at::randn({2, 3, 6, 8}, at::kDouble).requires_grad_();
      auto k = at::randn({2, 3, 6, 8}, at::kDouble).requires_grad_();
      auto [a, b] = coupling->forward(q, k);
      (a.sin().sum() + (b * b).sum()).backward();
      grads[recompute] = {q.grad(), k.grad()};
      for (const auto& p : coupling->parameters()) grads[recompute].push_back(p.grad());
    }
    for (size_t i = 0; i < grads[0].size(); ++i)
      EXPECT_TRUE(at::allclose(grads[0][i], grads[1][i], 1e-10, 1e-12)) << cqk::to_string(kind) << " grad " << i;
  }
}

TEST(Coupling, AffineParameterCountFollowsTheFormula) {
  // r(3d+1) + 2d per step per head: d = 64, r = 8, two steps -> 3,344 per head.
  const auto opts = CouplingOptions(CouplingKind::Affine, 12, 64).hidden(8).steps(2);
  QKCoupling coupling(opts);
  EXPECT_EQ(cqk::coupling_parameter_count(opts), 12 * 3344);
  EXPECT_EQ(coupling->parameter_count(), 12 * 3344);
  auto shared = opts;
  shared.shared_across_heads(true);
  EXPECT_EQ(QKCoupling(shared)->parameter_count(), 3344);
}

TEST(Coupling, ControlsMatchAffineParameterCountWithinFivePercent) {
  for (auto [dim, hidden, steps] : {std::tuple{64, 8, 2}, std::tuple{128, 8, 2}, std::tuple{64, 16, 4}}) {
    const auto affine = CouplingOptions(CouplingKind::Affine, 4, dim).hidden(hidden).steps(steps);
    const double target = static_cast<double>(QKCoupling(affine)->parameter_count());
    for (auto kind : {CouplingKind::NonInvertible, CouplingKind::Uncoupled, CouplingKind::Dynamics}) {
      auto control = affine;
      control.kind(kind);
      const auto count = QKCoupling(control)->parameter_count();
      EXPECT_EQ(count, cqk::coupling_parameter_count(control));
      EXPECT_NEAR(count / target, 1.0, 0.05) << cqk::to_string(kind) << " d=" << dim << " r=" << hidden;
    }
  }
}

TEST(Coupling, WrongShapesGiveAClearError) {
  QKCoupling coupling(options(CouplingKind::Affine));
  try {
    coupling->forward(at::randn({2, 4, 5, 8}), at::randn({2, 4, 5, 8}));
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[batch, 3, time, 8]"), std::string::npos) << e.what();
  }
}

// Each bad option is named with its value; a NaN clamp (every comparison
// false) would otherwise pass and make every output NaN.
TEST(Coupling, BadOptionsNameTheOptionAndItsValue) {
  const auto message = [](const CouplingOptions& o) {
    try {
      QKCoupling coupling(o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(options(CouplingKind::Affine).hidden(0)), "coupling: hidden must be positive, got 0");
  EXPECT_EQ(message(options(CouplingKind::Affine).steps(-1)), "coupling: steps must be positive, got -1");
  EXPECT_EQ(message(options(CouplingKind::Affine).clamp(std::nan(""))),
            "coupling: clamp must be positive and finite, got nan");
  EXPECT_EQ(message(options(CouplingKind::Affine).clamp(INFINITY)),
            "coupling: clamp must be positive and finite, got inf");
  EXPECT_EQ(message(CouplingOptions(CouplingKind::Affine, 0, 8)), "coupling: num_heads must be positive, got 0");
}

TEST(Coupling, Bfloat16InputsAreCoupledInFloat32) {
  at::manual_seed(4);
  QKCoupling coupling(options(CouplingKind::Affine));
  randomise(coupling);
  const auto q = at::randn({1, 3, 4, 8}), k = at::randn({1, 3, 4, 8});
  const auto [q_ref, k_ref] = coupling->forward(q, k);
  const auto [q_bf, k_bf] = coupling->forward(q.to(at::kBFloat16), k.to(at::kBFloat16));
  EXPECT_EQ(q_bf.scalar_type(), at::kBFloat16);
  EXPECT_LT(max_relative_error(k_bf.to(at::kFloat), k_ref), 2e-2);
}

// The __host__ __device__ math the CUDA kernels run, compiled here as C++,
// against the ATen path.
TEST(Coupling, KernelMathMatchesTheAtenPath) {
  constexpr int D = 64, R = 8, Steps = 2;
  at::manual_seed(5);
  const int64_t heads = 2;
  QKCoupling coupling(CouplingOptions(CouplingKind::Affine, heads, D).hidden(R).steps(Steps));
  randomise(coupling, 0.2);
  const auto q = at::randn({1, heads, 3, D}), k = at::randn({1, heads, 3, D});
  const auto [q_ref, k_ref] = coupling->forward(q, k);

  auto params = coupling->named_parameters();
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < 3; ++t) {
      cqk::kernels::AffineStepWeights steps[Steps];
      std::vector<at::Tensor> keep;
      for (int s = 0; s < Steps; ++s) {
        const std::string prefix = "conditioner" + std::to_string(s) + ".";
        for (const char* name : {"w1", "b1", "w2", "b2"}) keep.push_back(params[prefix + name][h].contiguous());
        steps[s] = {keep[4 * s].data_ptr<float>(), keep[4 * s + 1].data_ptr<float>(),
                    keep[4 * s + 2].data_ptr<float>(), keep[4 * s + 3].data_ptr<float>()};
      }
      auto qv = q[0][h][t].contiguous().clone(), kv = k[0][h][t].contiguous().clone();
      cqk::kernels::affine_coupling_forward<D, R>(qv.data_ptr<float>(), kv.data_ptr<float>(), steps, Steps, 2.0f);
      EXPECT_TRUE(at::allclose(qv, q_ref[0][h][t], 1e-5, 1e-5));
      EXPECT_TRUE(at::allclose(kv, k_ref[0][h][t], 1e-5, 1e-5));
      cqk::kernels::affine_coupling_inverse<D, R>(qv.data_ptr<float>(), kv.data_ptr<float>(), steps, Steps, 2.0f);
      EXPECT_TRUE(at::allclose(qv, q[0][h][t], 1e-5, 1e-5));
      EXPECT_TRUE(at::allclose(kv, k[0][h][t], 1e-5, 1e-5));
    }
  }
}

}  // namespace
