#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/cuda.h>

#include <stdexcept>
#include <string>

#include "cqk/config_loader.h"
#include "cqk/sdpa_backend.h"
#include "tools/tensor_compare.h"

// train.sdpa_backend: the names, torch's priority order it sets, the backend
// torch then picks, and (on a GPU) that each backend computes the same attention.
namespace {

// Puts torch's default order back when a test ends.
struct RestoreTorchOrder {
  ~RestoreTorchOrder() { cqk::use_sdpa_backend(cqk::SdpaBackend::Auto); }
};

TEST(SdpaBackend, NamesParseAndPrintBothWays) {
  for (const auto& name : cqk::sdpa_backend_names()) EXPECT_EQ(cqk::to_string(cqk::parse_sdpa_backend(name)), name);
  try {
    cqk::parse_sdpa_backend("fa9");
    FAIL() << "no error for an unknown backend";
  } catch (const std::invalid_argument& e) {
    std::string names;
    for (const auto& name : cqk::sdpa_backend_names()) names += (names.empty() ? "" : "|") + name;
    EXPECT_EQ(std::string(e.what()), "unknown train.sdpa_backend 'fa9' (expected " + names + ")");
  }
}

TEST(SdpaBackend, PutsTheChosenBackendFirstAndKeepsTheOthersAsFallbacks) {
  const RestoreTorchOrder restore;
  cqk::use_sdpa_backend(cqk::SdpaBackend::CuDnn);
  auto order = at::globalContext().sDPPriorityOrder();
  EXPECT_EQ(order[0], at::SDPBackend::cudnn_attention);
  EXPECT_EQ(order[1], at::SDPBackend::flash_attention);
  EXPECT_EQ(order[2], at::SDPBackend::efficient_attention);
  EXPECT_EQ(order[3], at::SDPBackend::math);
  cqk::use_sdpa_backend(cqk::SdpaBackend::Auto);
  order = at::globalContext().sDPPriorityOrder();
  EXPECT_EQ(order[0], at::SDPBackend::flash_attention);
  EXPECT_EQ(order[3], at::SDPBackend::cudnn_attention);
}

TEST(SdpaBackend, ReportsWhatTorchPicksOnTheCpuWhereTheOrderChangesNothing) {
  const RestoreTorchOrder restore;
  // Torch's CPU SDPA takes its flash kernel where it can and math otherwise;
  // the priority order is a CUDA matter.
  const auto picked = cqk::sdpa_backend_for(2, 4, 64, 32, 32, /*bf16=*/false, /*cuda=*/false);
  EXPECT_TRUE(picked == "flash" || picked == "math") << picked;
  cqk::use_sdpa_backend(cqk::SdpaBackend::Math);
  EXPECT_EQ(cqk::sdpa_backend_for(2, 4, 64, 32, 32, false, false), picked);
}

TEST(SdpaBackend, TheRunsPickIsAtItsAttentionsShape) {
  const RestoreTorchOrder restore;
  // Every layer of an MTA model with every = 1 scores explicitly: no SDPA.
  EXPECT_EQ(cqk::use_sdpa_backend(cqk::default_config({"model.attention.kind=mta", "model.attention.mta.every=1"}), 2,
                                  false, false),
            "none");
  const auto diff = cqk::use_sdpa_backend(cqk::default_config({"model.attention.kind=diff"}), 2, false, false);
  EXPECT_TRUE(diff == "flash" || diff == "math") << diff;
}

TEST(SdpaBackend, IsAConfigKeyWithItsChoices) {
  EXPECT_EQ(cqk::default_config().train.sdpa_backend, cqk::SdpaBackend::Auto);
  EXPECT_EQ(cqk::default_config({"train.sdpa_backend=cudnn"}).train.sdpa_backend, cqk::SdpaBackend::CuDnn);
  try {
    cqk::default_config({"train.sdpa_backend=fa9"});
    FAIL() << "no error for an unknown backend";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("train.sdpa_backend"), std::string::npos) << e.what();
  }
}

// Each backend the GPU takes for a training shape (bf16, head dim 64 and 128)
// computes causal attention and its gradients as the math backend does.
TEST(SdpaBackend, EveryBackendOnTheGpuMatchesMath) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: SDPA's GPU backends need one";
  const RestoreTorchOrder restore;
  for (const int64_t dim : {64, 128}) {
    at::manual_seed(dim);
    const auto options = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
    const auto q0 = at::randn({2, 4, 512, dim}, options), k0 = at::randn_like(q0), v0 = at::randn_like(q0);
    const auto grad = at::randn_like(q0);
    const auto run = [&](cqk::SdpaBackend backend) {
      cqk::use_sdpa_backend(backend);
      auto q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(), v = v0.clone().requires_grad_();
      const auto o = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
      o.backward(grad);
      return std::vector<at::Tensor>{o.detach(), q.grad(), k.grad(), v.grad()};
    };
    const auto reference = run(cqk::SdpaBackend::Math);
    for (const auto backend : {cqk::SdpaBackend::CuDnn, cqk::SdpaBackend::Flash, cqk::SdpaBackend::Efficient}) {
      cqk::use_sdpa_backend(backend);
      const auto picked = cqk::sdpa_backend_for(2, 4, 512, dim, dim, true, true);
      // Flash and efficient attention take bf16 at head dims 64 and 128 on
      // every GPU cqk builds for; cuDNN's reach depends on its version.
      if (backend != cqk::SdpaBackend::CuDnn) EXPECT_EQ(picked, cqk::to_string(backend)) << "dim " << dim;
      const auto got = run(backend);
      for (std::size_t i = 0; i < got.size(); ++i)
        EXPECT_LT(cqk::testing::max_relative_error(got[i], reference[i]), 3e-2)
            << cqk::to_string(backend) << " (torch picked " << picked << "), dim " << dim << ", tensor " << i;
    }
  }
}

}  // namespace
