#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ops/cpu_coupling.h"
#include "cqk/coupling.h"
#include "ops/cuda_coupling.h"
#include "cqk/rope.h"
#include "ops/kernel_arguments.h"
#include "simd/simd_variants.h"
#include "test_io.h"
#include "tools/tensor_compare.h"

// The CPU kernel of the affine coupling (src/simd/) against the ATen path in
// float64: outputs, input gradients and every weight gradient, on fresh random
// weights and inputs, per-head and shared weights, hidden 8 and 16, strided inputs.
namespace {

using cqk::CouplingKind;
using cqk::CouplingOptions;
using cqk::QKCoupling;
using cqk::testing::max_relative_error;

void randomise(QKCoupling& coupling, double scale = 0.3) {
  at::NoGradGuard no_grad;
  for (auto& p : coupling->parameters()) p.copy_(at::randn_like(p) * scale);
}

bool kernel_runs_here() {
  return cqk::cpu::affine_coupling_supported({1, 1, 1, 8, 8}, /*steps=*/1, /*clamp=*/2.0f);
}

struct Case {
  int64_t batch, heads, time, dim, hidden, steps;
  bool shared, strided;
  double weight_scale = 0.3;  // larger maps get smaller weights, or float32 rounding grows past the bound
  bool rope = false;          // the kernel also applies RoPE; the references run apply_rope after the coupling
  bool k_dense = false;       // k contiguous while q is strided (grouped-query attention expands k)
};

constexpr double kRopeBase = 10000.0;

// Outputs and gradients (q, k, then every parameter) of the coupling on (q, k)
// with the upstream gradients (gq, gk), followed by RoPE when `rope`: in one
// kernel call where the CPU kernel applies, else as the ATen coupling and apply_rope.
std::vector<at::Tensor> outputs_and_gradients(QKCoupling& coupling, const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& gq, const at::Tensor& gk, bool rope = false) {
  for (auto& p : coupling->parameters()) p.mutable_grad() = at::Tensor();
  auto qi = q.detach().clone().requires_grad_(true), ki = k.detach().clone().requires_grad_(true);
  const auto [q_out, k_out] = [&]() -> std::pair<at::Tensor, at::Tensor> {
    if (!rope) return coupling->forward(qi, ki);
    if (cqk::cpu_affine_coupling_applies(*coupling, qi, ki)) return cqk::cpu_affine_coupling(*coupling, qi, ki, kRopeBase);
    const auto [a, b] = coupling->forward(qi, ki);
    return {cqk::apply_rope(a, kRopeBase), cqk::apply_rope(b, kRopeBase)};
  }();
  torch::autograd::backward({q_out, k_out}, {gq, gk});
  std::vector<at::Tensor> result{q_out.detach(), k_out.detach(), qi.grad(), ki.grad()};
  for (const auto& p : coupling->parameters()) result.push_back(p.grad());
  return result;
}

void check_against_float64(const Case& c, uint64_t seed) {
  at::manual_seed(seed);
  const auto options = CouplingOptions(CouplingKind::Affine, c.heads, c.dim)
                           .hidden(c.hidden)
                           .steps(c.steps)
                           .shared_across_heads(c.shared);
  QKCoupling coupling(options);
  randomise(coupling, c.weight_scale);
  QKCoupling reference(options);
  {
    at::NoGradGuard no_grad;
    const auto from = coupling->parameters();
    auto to = reference->parameters();
    for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  }
  reference->to(at::kDouble);
  // A strided input: the [batch, time, heads, dim] layout of a projection, viewed per head.
  const auto make = [&](bool strided) {
    return strided ? at::randn({c.batch, c.time, c.heads, c.dim}).transpose(1, 2)
                   : at::randn({c.batch, c.heads, c.time, c.dim});
  };
  const auto q = make(c.strided), k = make(c.strided && !c.k_dense);
  const auto gq = at::randn({c.batch, c.heads, c.time, c.dim}), gk = at::randn_like(gq);
  ASSERT_TRUE(cqk::cpu_affine_coupling_applies(*coupling, q, k));

  const auto got = outputs_and_gradients(coupling, q, k, gq, gk, c.rope);
  const auto want = outputs_and_gradients(reference, q.to(at::kDouble), k.to(at::kDouble), gq.to(at::kDouble),
                                          gk.to(at::kDouble), c.rope);
  // The ATen path in float32 sets the scale of float32 rounding for this map
  // (random weights with several steps amplify it well above 1e-6).
  cqk::set_fused_coupling_enabled(false);
  const auto aten = outputs_and_gradients(coupling, q, k, gq, gk, c.rope);
  cqk::set_fused_coupling_enabled(true);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_FALSE(at::allclose(want[1], k.to(at::kDouble))) << "the randomised map must not be the identity";
  const char* names[] = {"q_out", "k_out", "grad q", "grad k"};
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].defined()) << i;
    const double aten_error = max_relative_error(aten[i], want[i]);
    EXPECT_LT(max_relative_error(got[i], want[i]), std::max(2e-5, 4 * aten_error))
        << (i < 4 ? names[i] : "weight gradient " + std::to_string(i - 4)) << ", case d=" << c.dim
            << " r=" << c.hidden << " steps=" << c.steps << (c.shared ? " shared" : "") << (c.rope ? " rope" : "")
        << "; ATen float32 error " << aten_error;
  }
}

}  // namespace

TEST(CpuCoupling, MatchesTheFloat64AtenPathOnFreshRandomInputs) {
  if (!kernel_runs_here()) GTEST_SKIP() << "this CPU has no AVX2/FMA: the ATen path runs instead";
  const Case cases[] = {
      {2, 3, 17, 64, 8, 2, false, false},  // the default: per-head weights, two steps
      {2, 3, 17, 64, 8, 2, false, true},   // read in place from a [batch, time, heads, dim] projection
      {1, 4, 9, 32, 16, 3, true, false},   // shared weights, an odd number of steps
      {3, 2, 5, 128, 8, 4, false, true, 0.1},
      {1, 1, 1, 8, 16, 1, false, false},
      // Rows of several chunks (64 or 32 tokens) and a partial one.
      {2, 3, 150, 32, 8, 2, false, true},
      // Coupling and RoPE in one kernel call, as the attention calls it.
      {2, 3, 150, 32, 8, 2, false, true, 0.3, /*rope=*/true},
      {1, 4, 9, 64, 16, 3, true, false, 0.15, /*rope=*/true},
      // q strided from its projection, k contiguous (each read with its own strides).
      {2, 3, 40, 64, 8, 2, false, true, 0.3, /*rope=*/false, /*k_dense=*/true},
  };
  // Large inputs: pre-activations of -100 and less, where exp(-a) overflows float32.
  {
    at::manual_seed(99);
    QKCoupling coupling(CouplingOptions(CouplingKind::Affine, 2, 64).hidden(8));
    randomise(coupling);
    const auto q = at::randn({1, 2, 16, 64}) * 500.0, k = at::randn_like(q) * 500.0;
    const auto [q_out, k_out] = coupling->forward(q, k);
    EXPECT_TRUE(at::isfinite(q_out).all().item<bool>() && at::isfinite(k_out).all().item<bool>());
  }
  uint64_t seed = 1;
  for (const auto& c : cases) check_against_float64(c, seed++);
}

TEST(CpuCoupling, TwoThreadsGiveTheOneThreadResult) {
  if (!kernel_runs_here()) GTEST_SKIP() << "this CPU has no AVX2/FMA";
  at::manual_seed(7);
  QKCoupling coupling(CouplingOptions(CouplingKind::Affine, 4, 64).hidden(8));
  randomise(coupling);
  // Several chunks per row; each thread's share spans heads, so it flushes its gradient sums per head.
  const auto q = at::randn({2, 4, 150, 64}), k = at::randn_like(q), gq = at::randn_like(q), gk = at::randn_like(q);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const auto one = outputs_and_gradients(coupling, q, k, gq, gk);
  at::set_num_threads(2);
  const auto two = outputs_and_gradients(coupling, q, k, gq, gk);
  at::set_num_threads(threads);
  for (size_t i = 0; i < one.size(); ++i) {
    // Per-token results are identical; weight gradients are summed in another order.
    if (i < 4) EXPECT_TRUE(at::equal(one[i], two[i])) << i;
    else EXPECT_LT(max_relative_error(two[i], one[i].to(at::kDouble)), 1e-6) << i;
  }
}

TEST(CpuCoupling, IsExactlyTheIdentityAtInit) {
  if (!kernel_runs_here()) GTEST_SKIP() << "this CPU has no AVX2/FMA";
  at::manual_seed(8);
  QKCoupling coupling(CouplingOptions(CouplingKind::Affine, 2, 64).hidden(8));
  const auto q = at::randn({2, 2, 11, 64}), k = at::randn_like(q);
  ASSERT_TRUE(cqk::cpu_affine_coupling_applies(*coupling, q, k));
  const auto [q_out, k_out] = coupling->forward(q, k);
  EXPECT_TRUE(at::equal(q_out, q));
  EXPECT_TRUE(at::equal(k_out, k));
}

TEST(CpuCoupling, OtherInputsAndTheSwitchTakeTheAtenPath) {
  QKCoupling coupling(CouplingOptions(CouplingKind::Affine, 2, 64).hidden(8));
  const auto q = at::randn({1, 2, 4, 64}), k = at::randn_like(q);
  EXPECT_FALSE(cqk::cpu_affine_coupling_applies(*coupling, q.to(at::kDouble), k.to(at::kDouble)));
  // Channels must be contiguous (the rows may have any other strides, each tensor its own).
  EXPECT_FALSE(cqk::cpu_affine_coupling_applies(*coupling, q, k.transpose(2, 3).contiguous().transpose(2, 3)));
  EXPECT_EQ(cqk::cpu_affine_coupling_applies(*coupling, q, k.transpose(1, 2).contiguous().transpose(1, 2)),
            kernel_runs_here());
  QKCoupling hidden4(CouplingOptions(CouplingKind::Affine, 2, 64).hidden(4));
  EXPECT_FALSE(cqk::cpu_affine_coupling_applies(*hidden4, q, k));
  QKCoupling saving(CouplingOptions(CouplingKind::Affine, 2, 64).hidden(8).recompute_from_inverse(false));
  EXPECT_FALSE(cqk::cpu_affine_coupling_applies(*saving, q, k));
  cqk::set_fused_coupling_enabled(false);
  EXPECT_FALSE(cqk::cpu_affine_coupling_applies(*coupling, q, k));
  cqk::set_fused_coupling_enabled(true);
  EXPECT_EQ(cqk::cpu_affine_coupling_applies(*coupling, q, k), kernel_runs_here());
}

// On an AVX-512 machine both compiled copies run here: the AVX2 copy must give
// the AVX-512 copy's results (the float64 test above checks the one dispatched),
// with RoPE after the coupling and without.
TEST(CpuCoupling, TheAvx2AndAvx512CopiesAgree) {
  if (std::string(cqk::cpu::simd_variant()) != "avx512") GTEST_SKIP() << "this CPU has no AVX-512";
  at::manual_seed(12);
  const int64_t B = 2, H = 3, T = 21, D = 64, R = 16, S = 3;
  QKCoupling coupling(CouplingOptions(CouplingKind::Affine, H, D).hidden(R).steps(S));
  randomise(coupling, 0.2);
  const auto weights = cqk::fused::affine_weights(*coupling);
  namespace args = cqk::kernel_arguments;
  const auto params = args::coupling_params(coupling->options(), weights, at::kCPU, "test");
  const auto q = at::randn({B, H, T, D}), k = at::randn_like(q), gq = at::randn_like(q), gk = at::randn_like(q);
  const auto shape = args::shape_of(coupling->options(), q);
  using Forward = decltype(&cqk::cpu::avx2::forward);
  using Backward = decltype(&cqk::cpu::avx2::backward);
  const auto [cos, sin] = cqk::rope_tables(T, D, kRopeBase, at::kCPU);
  cqk::kernels::RopeTables rope;
  const auto run = [&](Forward forward, Backward backward) {
    auto q_out = at::empty_like(q), k_out = at::empty_like(q), dq = at::empty_like(q), dk = at::empty_like(q);
    std::vector<at::Tensor> grads;
    for (const auto& w : weights) grads.push_back(at::zeros_like(w));
    forward(shape, params, q.data_ptr<float>(), args::row_strides(q), k.data_ptr<float>(), args::row_strides(k),
            q_out.data_ptr<float>(), k_out.data_ptr<float>(), rope);
    backward(shape, params, q_out.data_ptr<float>(), k_out.data_ptr<float>(), gq.data_ptr<float>(),
             gk.data_ptr<float>(), dq.data_ptr<float>(), dk.data_ptr<float>(),
             args::coupling_grads(weights, grads, at::kCPU, "test"), rope);
    std::vector<at::Tensor> all{q_out, k_out, dq, dk};
    all.insert(all.end(), grads.begin(), grads.end());
    return all;
  };
  for (bool with_rope : {false, true}) {
    rope = with_rope ? cqk::kernels::RopeTables{cos.data_ptr<float>(), sin.data_ptr<float>()}
                     : cqk::kernels::RopeTables{};
    const auto narrow = run(cqk::cpu::avx2::forward, cqk::cpu::avx2::backward);
    const auto wide = run(cqk::cpu::avx512::forward, cqk::cpu::avx512::backward);
    for (size_t i = 0; i < narrow.size(); ++i)
      EXPECT_LT(max_relative_error(narrow[i], wide[i].to(at::kDouble)), 1e-5) << i << (with_rope ? " rope" : "");
  }
}

// The kernel's OpenMP and torch's are one runtime (one thread pool, one
// thread count): the wheel's libgomp.so.1 and the system's share a soname.
TEST(CpuCoupling, OneOpenMPRuntimeIsLoaded) {
  if (!kernel_runs_here()) GTEST_SKIP() << "this CPU has no AVX2/FMA";
  QKCoupling coupling(CouplingOptions(CouplingKind::Affine, 2, 64).hidden(8));
  const auto q = at::randn({1, 2, 64, 64});
  coupling->forward(q, q);
  at::matmul(at::randn({256, 256}), at::randn({256, 256}));
  const auto runtimes = cqk::testing::mapped_files("libgomp");
  EXPECT_EQ(runtimes.size(), 1u) << "OpenMP runtimes: " << runtimes.size();
}
