#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "cqk/coupling.h"
#include "cqk/headwise_mlp.h"
#include "cqk/model.h"
#include "cqk/rms_norm.h"

// The decoder: parameter accounting, shapes, causality of the whole LM and the
// masked loss. The coupling at init giving the base's logits, with shared
// weights, is tests/initialisation_test.cpp's.
namespace {

cqk::ModelConfig tiny(const std::string& attention = "vanilla", const std::string& coupling = "none") {
  cqk::ModelConfig config;
  config.vocab_size = 32;
  config.width = 32;
  config.layers = 2;
  config.heads = 4;
  config.attention.kind() = cqk::parse_attention_kind(attention);
  config.attention.coupling().kind() = cqk::parse_coupling_kind(coupling);
  return config;
}

int64_t parameter_count(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

TEST(Model, ParameterBreakdownSumsToTheParameterCount) {
  for (const std::string attention : {"vanilla", "diff"}) {
    for (const std::string coupling : {"none", "affine"}) {
      at::manual_seed(0);
      cqk::TransformerLM model(tiny(attention, coupling));
      const auto breakdown = model->parameter_breakdown();
      const std::string label = attention + " + " + coupling;
      EXPECT_EQ(breakdown.total(), parameter_count(*model)) << label;
      EXPECT_EQ(breakdown.embedding, 32 * 32) << label;  // tied: counted once
      EXPECT_GT(breakdown.attention, 0) << label;
      EXPECT_GT(breakdown.mlp, 0) << label;
      EXPECT_GT(breakdown.norm, 0) << label;
      // Differential shares one coupling between a head's two (q, k) pairs: heads/2 coupled heads.
      const bool diff = attention == "diff";
      const auto options = cqk::CouplingOptions(cqk::parse_coupling_kind(coupling), diff ? 2 : 4, 8).hidden(8).steps(2);
      EXPECT_EQ(breakdown.coupling, 2 * cqk::coupling_parameter_count(options)) << label;
      if (coupling == "affine") {
        EXPECT_GT(breakdown.coupling, 0) << label;
        EXPECT_NE(breakdown.describe().find("coupling"), std::string::npos);
      } else {
        EXPECT_EQ(breakdown.coupling, 0) << label;
      }
      // Training FLOPs: 6 per parameter plus the attention scores.
      EXPECT_DOUBLE_EQ(model->flops_per_token(16), 6.0 * breakdown.total() + 12.0 * 2 * 32 * 16) << label;
    }
  }
}

TEST(Model, LogitsHaveShapeBatchTimeVocab) {
  at::manual_seed(1);
  cqk::TransformerLM model(tiny("vanilla", "affine"));
  const auto tokens = at::randint(32, {3, 16}, at::kLong);
  const auto logits = model->forward(tokens);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 16, 32}));
  EXPECT_EQ(logits.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::isfinite(logits).all().item<bool>());
}

TEST(Model, LaterTokensNeverChangeEarlierLogits) {
  for (const std::string attention : {"vanilla", "diff"}) {
    at::manual_seed(2);
    cqk::TransformerLM model(tiny(attention, "affine"));
    model->to(at::kDouble);
    {
      // A non-identity coupling, so that its part of the map matters too.
      at::NoGradGuard no_grad;
      for (auto& item : model->named_parameters())
        if (item.key().find(".coupling.") != std::string::npos) item.value().copy_(at::randn_like(item.value()) * 0.3);
    }
    const auto tokens = at::randint(32, {2, 16}, at::kLong);
    const auto logits = model->forward(tokens);
    for (int64_t t : {0, 7, 14}) {
      auto changed = tokens.clone();
      changed.narrow(1, t + 1, 16 - t - 1).copy_(at::randint(32, {2, 16 - t - 1}, at::kLong));
      changed.select(1, t + 1).copy_((tokens.select(1, t + 1) + 1) % 32);  // certainly different
      const auto changed_logits = model->forward(changed);
      EXPECT_TRUE(at::allclose(logits.narrow(1, 0, t + 1), changed_logits.narrow(1, 0, t + 1), 0, 1e-12))
          << attention << " t=" << t;
      EXPECT_FALSE(at::allclose(logits.narrow(1, t + 1, 1), changed_logits.narrow(1, t + 1, 1), 0, 1e-12))
          << attention << " t=" << t;
    }
  }
}

TEST(Model, LossIsTheMeanCrossEntropyOverScoredTargets) {
  at::manual_seed(4);
  cqk::TransformerLM model(tiny("vanilla", "affine"));
  const auto tokens = at::randint(32, {2, 16}, at::kLong);
  auto targets = at::randint(32, {2, 16}, at::kLong);
  // Only a few scored positions, as in the recall task.
  auto mask = at::rand({2, 16}) < 0.3;
  mask.index_put_({0, 5}, true);
  targets.masked_fill_(mask.logical_not(), -100);

  const auto logits = model->forward(tokens).to(at::kDouble);
  const auto log_probs = at::log_softmax(logits, -1);
  double sum = 0.0;
  int64_t scored = 0;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 16; ++t) {
      const int64_t target = targets[b][t].item<int64_t>();
      if (target < 0) continue;
      sum -= log_probs[b][t][target].item<double>();
      ++scored;
    }
  }
  ASSERT_GT(scored, 0);
  const double loss = model->loss(tokens, targets).item<double>();
  EXPECT_NEAR(loss, sum / static_cast<double>(scored), 1e-5);

  // Changing a scored target changes the loss.
  auto other = targets.clone();
  other.index_put_({0, 5}, (targets[0][5].item<int64_t>() + 1) % 32);
  EXPECT_NE(model->loss(tokens, other).item<double>(), loss);
}

TEST(Model, BadConfigsThrow) {
  auto config = tiny();
  config.vocab_size = 1;
  EXPECT_THROW(cqk::TransformerLM{config}, std::invalid_argument);
  config = tiny();
  config.layers = 0;
  EXPECT_THROW(cqk::TransformerLM{config}, std::invalid_argument);
}

// Modules built directly (the C++ API) name a bad size with its value, one
// line, instead of a c10::Error with a backtrace from the first tensor made.
TEST(Model, ModulesNameABadSize) {
  const auto message = [](auto make) {
    try {
      make();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([] { cqk::RMSNorm(0, 1e-5); }), "rms_norm: dim must be positive, got 0");
  EXPECT_EQ(message([] { cqk::RMSNorm(8, std::nan("")); }), "rms_norm: eps must be positive and finite, got nan");
  EXPECT_EQ(message([] { cqk::MLP(16, -4, true); }), "mlp: hidden must be positive, got -4");
  EXPECT_EQ(message([] { cqk::HeadwiseMLP(2, 8, 0, 8, true); }), "headwise_mlp: hidden must be positive, got 0");
}

}  // namespace
