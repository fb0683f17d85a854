// GPU tests of the fused affine coupling (kernels/coupling_kernels.cu) against
// the ATen path. They skip without a CUDA device; scripts/gpu_check.sh runs
// them on a GPU machine. The checks themselves live in tools/fused_check.h,
// shared with `cqk_kernel_bench --check` (gpu_check.sh's fallback when the full
// build cannot be configured there).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/cuda.h>
#ifdef CQK_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "cqk/attention.h"
#include "cqk/coupling.h"
#include "ops/cuda_coupling.h"
#include "test_io.h"
#include "tools/fused_check.h"

namespace {

using cqk::fused_check::Case;

// A GPU check must say Skipped where it cannot run: a bare `return` before its
// GPU half would report it Passed with nothing tested. This looks for such
// returns in every test source.
TEST(GpuTests, SkipRatherThanReturnWithoutAGpu) {
  const std::regex early_return(R"(if\s*\(\s*!\s*[\w:]*(is_available|_built)\(\)\s*\)\s*return\b)");
  const std::string tests = std::string(CQK_SOURCE_DIR) + "/tests";
  for (const std::string folder : {tests, tests + "/kernel_emulation"}) {
    for (const auto& name : cqk::testing::folder_entries(folder)) {
      if (name.size() < 4 || name.compare(name.size() - 4, 4, ".cpp") != 0) continue;
      EXPECT_FALSE(std::regex_search(cqk::testing::read_file(folder + "/" + name), early_return))
          << folder << "/" << name << ": GTEST_SKIP() instead of returning early (CQK_REQUIRE_GPU)";
    }
  }
}

// The GPU checks' comparison, which runs anywhere: a reference below the floor
// (the exactly zero q gradient of attention over one token) against float32
// rounding passes; a real error, a wrong value or an unwritten element fails.
TEST(FusedCheck, ComparisonFloorsTheReferenceMagnitude) {
  using cqk::fused_check::detail::compare;
  const auto zero = at::zeros({4, 64}, at::kDouble);
  cqk::fused_check::Result rounding;
  compare(rounding, "dq", at::full({4, 64}, 1e-7), zero, 2e-4);
  EXPECT_TRUE(rounding.ok) << rounding.report;
  EXPECT_NEAR(rounding.worst, 1e-5, 1e-9) << "1e-7 against the floor of 1e-2";
  cqk::fused_check::Result wrong;
  compare(wrong, "dq", at::full({4, 64}, 1e-4), zero, 2e-4);
  EXPECT_FALSE(wrong.ok) << wrong.report;
  cqk::fused_check::Result large;  // above the floor the error is relative to max |reference|
  compare(large, "o", at::full({3}, 101.0), at::full({3}, 100.0), 2e-2);
  EXPECT_TRUE(large.ok) << large.report;
  EXPECT_DOUBLE_EQ(large.worst, 1e-2);
  cqk::fused_check::Result unwritten;
  compare(unwritten, "o", at::full({3}, std::numeric_limits<double>::quiet_NaN()), at::zeros({3}), 1.0);
  EXPECT_FALSE(unwritten.ok) << unwritten.report;
}

#define CQK_REQUIRE_GPU()                                                                             \
  do {                                                                                                \
    if (!torch::cuda::is_available())                                                                 \
      GTEST_SKIP() << "no CUDA device: fused kernel tests need a GPU (scripts/gpu_check.sh)";         \
    if (!cqk::cuda_coupling_built())                                                                 \
      GTEST_SKIP() << "cqk was built without CUDA (CQK_WITH_CUDA off): no fused kernels to test";     \
  } while (0)

TEST(FusedCoupling, KernelsMatchTheAtenPathOnFreshRandomInputs) {
  CQK_REQUIRE_GPU();
  uint64_t seed = 100;
  for (const Case& c : cqk::fused_check::standard_cases()) {
    const auto result = cqk::fused_check::check_kernels(c, seed++);
    EXPECT_TRUE(result.ok) << c.name() << "\n" << result.report;
  }
}

TEST(FusedCoupling, FreshInputsGiveTheSameAgreementAgain) {
  // A second draw: an error that moves between draws (a race, an unwritten
  // element that happened to hold the right value) shows up here.
  CQK_REQUIRE_GPU();
  Case plain;
  plain.time = 513;
  Case normed = plain;  // QK-norm's weight-gradient sums and RoPE's shuffles too
  normed.qk_norm = normed.rope = true;
  normed.tokens_per_block = 64;
  for (Case c : {plain, normed}) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      c.dtype = dtype;
      for (uint64_t seed : {7u, 8u, 9u}) {
        const auto result = cqk::fused_check::check_kernels(c, seed);
        EXPECT_TRUE(result.ok) << c.name() << " seed " << seed << "\n" << result.report;
      }
    }
  }
}

TEST(FusedCoupling, ModuleForwardDispatchesToTheFusedPathAndMatchesAten) {
  CQK_REQUIRE_GPU();
  for (bool shared : {false, true}) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      Case c;
      c.shared = shared;
      c.dtype = dtype;
      c.strided = true;  // the layout the attention module passes (heads split from [b, t, h*d])
      const auto result = cqk::fused_check::check_module_dispatch(c, shared ? 11 : 12);
      EXPECT_TRUE(result.ok) << c.name() << "\n" << result.report;
    }
  }
}

TEST(FusedCoupling, UnsupportedShapesFallBackToAten) {
  CQK_REQUIRE_GPU();
  // head_dim 32 is not compiled: the module must take the ATen path, not fail.
  cqk::QKCoupling coupling(cqk::CouplingOptions(cqk::CouplingKind::Affine, 2, 32).hidden(8));
  coupling->to(at::kCUDA);
  const auto q = at::randn({1, 2, 5, 32}, at::kCUDA), k = at::randn({1, 2, 5, 32}, at::kCUDA);
  EXPECT_FALSE(cqk::cuda_affine_coupling_applies(*coupling, q, k));
  const auto [q_out, k_out] = coupling->forward(q, k);
  EXPECT_TRUE(at::equal(q_out, q)) << "identity at init";
  // Half precision is not compiled either.
  cqk::QKCoupling coupling64(cqk::CouplingOptions(cqk::CouplingKind::Affine, 2, 64));
  coupling64->to(at::kCUDA);
  const auto h = at::randn({1, 2, 5, 64}, at::kCUDA).to(at::kHalf);
  EXPECT_FALSE(cqk::cuda_affine_coupling_applies(*coupling64, h, h));
  EXPECT_NO_THROW(coupling64->forward(h, h));
}

TEST(FusedCoupling, IdentityAtInitIsExactInFloat32) {
  CQK_REQUIRE_GPU();
  // W2 = b2 = 0: s = t = 0, so y * exp(0) + 0 must give back every bit.
  cqk::QKCoupling coupling(cqk::CouplingOptions(cqk::CouplingKind::Affine, 3, 64));
  coupling->to(at::kCUDA);
  const auto q = at::randn({2, 3, 17, 64}, at::kCUDA), k = at::randn({2, 3, 17, 64}, at::kCUDA);
  ASSERT_TRUE(cqk::cuda_affine_coupling_applies(*coupling, q, k));
  const auto [q_out, k_out] = coupling->forward(q, k);
  EXPECT_TRUE(at::equal(q_out, q));
  EXPECT_TRUE(at::equal(k_out, k));
}

// An affine-coupled cqk::Attention on the GPU, width 256, 4 heads of 64, with
// small random weights everywhere.
cqk::Attention random_attention(cqk::AttentionOptions options) {
  options.coupling().kind(cqk::CouplingKind::Affine).hidden(8).steps(2);
  cqk::Attention attention(options);
  attention->to(at::kCUDA);
  at::NoGradGuard no_grad;
  for (auto& p : attention->parameters()) p.copy_(at::randn_like(p) * 0.05);
  return attention;
}

// The output, the input gradient and every parameter gradient of attention(x0)
// under the upstream gradient `grad`.
std::vector<at::Tensor> outputs_and_gradients(cqk::Attention& attention, const at::Tensor& x0, const at::Tensor& grad) {
  for (auto& p : attention->parameters()) p.mutable_grad() = at::Tensor();
  auto x = x0.detach().requires_grad_();
  const auto y = attention->forward(x);
  y.backward(grad);
  std::vector<at::Tensor> result{y.detach(), x.grad()};
  for (const auto& p : attention->parameters()) result.push_back(p.grad());
  return result;
}

// Every tensor of `got` within `tolerance` of `want`, relative to the largest |want|.
void expect_close(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want, double tolerance,
                  const std::string& context) {
  ASSERT_EQ(got.size(), want.size()) << context;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LT(cqk::testing::max_relative_error(got[i], want[i]), tolerance)
        << context << ", tensor " << i << " (0: output, 1: input gradient, then parameter gradients)";
  }
}

// The attention modules the fused coupling serves.
struct ModuleCase {
  cqk::AttentionKind kind;
  bool separate_pairs;
};

// cqk::Attention runs its coupling, QK-norm (qknorm kind) and RoPE in the
// fused coupling kernel; it must give what the ATen
// coupling, RMSNorm and RoPE give, with gradients and without (inference keeps
// no coupled outputs).
TEST(FusedCoupling, AttentionWithRopeMatchesTheAtenPath) {
  CQK_REQUIRE_GPU();
  const ModuleCase cases[] = {{cqk::AttentionKind::Vanilla, false},
                              {cqk::AttentionKind::Differential, false},
                              {cqk::AttentionKind::Differential, true},
                              {cqk::AttentionKind::QKNorm, false},
                              {cqk::AttentionKind::MultiToken, false}};
  for (const auto& [kind, separate_pairs] : cases) {
    at::manual_seed(6);
    cqk::Attention attention = random_attention(
        cqk::AttentionOptions(/*width=*/256, /*heads=*/4).kind(kind).rope(true).coupling(
            cqk::CouplingOptions().separate_pairs(separate_pairs)));
    {
      // The fused path must take the module's own head-split q and k (and norm weights).
      const auto coupling = std::dynamic_pointer_cast<cqk::QKCouplingImpl>(attention->named_children()["coupling"]);
      ASSERT_TRUE(coupling);
      const auto qk = at::randn({2, 97, 4, 64}, at::kCUDA).transpose(1, 2);
      ASSERT_TRUE(cqk::cuda_affine_coupling_applies(*coupling, qk, qk)) << cqk::to_string(kind);
      if (kind == cqk::AttentionKind::QKNorm)
        ASSERT_TRUE(cqk::cuda_qk_norm_applies(attention->q_norm->weight, attention->k_norm->weight, qk));
    }
    const auto x0 = at::randn({2, 97, 256}, at::kCUDA), grad = at::randn({2, 97, 256}, at::kCUDA);
    std::vector<at::Tensor> results[2];
    const bool was_enabled = cqk::fused_coupling_enabled();
    for (int fused = 0; fused < 2; ++fused) {
      cqk::set_fused_coupling_enabled(fused == 1);
      results[fused] = outputs_and_gradients(attention, x0, grad);
    }
    at::Tensor inference;
    {
      at::NoGradGuard no_grad;
      inference = attention->forward(x0);
    }
    cqk::set_fused_coupling_enabled(was_enabled);
    expect_close(results[1], results[0], 2e-4, cqk::to_string(kind) + ", fused coupling against ATen");
    expect_close({inference}, {results[0][0]}, 2e-4, cqk::to_string(kind) + ", fused inference against ATen");
  }
}

}  // namespace
