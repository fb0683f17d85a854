#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <string>
#include <vector>

#include "cqk/batch_source.h"
#include "cqk/config_loader.h"
#include "cqk/model.h"
#include "model/initialisation.h"

// Initialisation keyed by (seed, parameter name), the ground of the paired
// design: base and coupled models of one seed share every common parameter
// bit for bit, compute the same function at step 0, and see the same batches.
namespace {

const std::vector<std::string>& kAttentionKinds = cqk::attention_kind_names();

cqk::ModelConfig tiny(const std::string& attention, const std::string& coupling) {
  cqk::ModelConfig config;
  config.vocab_size = 40;
  config.width = 32;
  config.layers = 4;  // MTA's layer every 4th: the last
  config.heads = 4;
  config.attention.kind() = cqk::parse_attention_kind(attention);
  config.attention.coupling().kind() = cqk::parse_coupling_kind(coupling);
  return config;
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() && at::equal(a, b);
}

TEST(Initialisation, BaseAndCoupledModelsShareEveryCommonParameterBitForBit) {
  for (const auto& attention : kAttentionKinds) {
    cqk::TransformerLM base(tiny(attention, "none"), 7);
    cqk::TransformerLM coupled(tiny(attention, "affine"), 7);
    const auto coupled_parameters = coupled->named_parameters();
    for (const auto& item : base->named_parameters()) {
      const auto* match = coupled_parameters.find(item.key());
      ASSERT_NE(match, nullptr) << attention << ": " << item.key();
      EXPECT_TRUE(bitwise_equal(item.value(), *match)) << attention << ": " << item.key();
    }
    // What the coupled model has beyond the base is the coupling.
    for (const auto& item : coupled_parameters)
      if (!base->named_parameters().find(item.key()))
        EXPECT_NE(item.key().find(".coupling."), std::string::npos) << attention << ": " << item.key();
  }
}

TEST(Initialisation, DoesNotDependOnTorchsGlobalGenerator) {
  // A random parameter that the keyed initialisation missed (a new kind's,
  // say: add its distribution to src/model/initialisation.cpp) would keep the
  // constructor's draw from the global generator and differ here.
  for (const auto& attention : kAttentionKinds) {
    for (const auto& coupling : cqk::coupling_kind_names()) {
      const std::string label = attention + " + " + coupling;
      at::manual_seed(1);
      cqk::TransformerLM first(tiny(attention, coupling), 11);
      at::manual_seed(2);
      (void)at::randn({1000});
      cqk::TransformerLM second(tiny(attention, coupling), 11);
      const auto second_parameters = second->named_parameters();
      for (const auto& item : first->named_parameters())
        EXPECT_TRUE(bitwise_equal(item.value(), second_parameters[item.key()])) << label << ": " << item.key();
    }
  }
}

TEST(Initialisation, TheSeedChangesEveryRandomParameter) {
  cqk::TransformerLM a(tiny("diff", "affine"), 1), b(tiny("diff", "affine"), 2);
  const auto b_parameters = b->named_parameters();
  int random = 0;
  for (const auto& item : a->named_parameters()) {
    const bool fixed = item.key().find("norm") != std::string::npos || item.key().find(".b1") != std::string::npos ||
                       item.key().find(".w2") != std::string::npos || item.key().find(".b2") != std::string::npos;
    if (fixed) continue;
    EXPECT_FALSE(at::equal(item.value(), b_parameters[item.key()])) << item.key();
    ++random;
  }
  EXPECT_GT(random, 0);
}

TEST(Initialisation, ParameterSeedsDependOnTheSeedAndTheWholeName) {
  EXPECT_EQ(cqk::parameter_seed(1, "blocks.0.attention.q_proj.weight"),
            cqk::parameter_seed(1, "blocks.0.attention.q_proj.weight"));
  EXPECT_NE(cqk::parameter_seed(1, "blocks.0.attention.q_proj.weight"),
            cqk::parameter_seed(2, "blocks.0.attention.q_proj.weight"));
  EXPECT_NE(cqk::parameter_seed(1, "blocks.0.attention.q_proj.weight"),
            cqk::parameter_seed(1, "blocks.1.attention.q_proj.weight"));
}

TEST(Initialisation, KeepsEachParameterKindsDistribution) {
  auto config = tiny("diff", "affine");
  config.width = 256;
  config.heads = 4;
  config.vocab_size = 512;
  cqk::TransformerLM model(config, 3);
  const double std = config.init_std, residual = std / std::sqrt(2.0 * config.layers);
  const auto sd = [](const at::Tensor& t) { return t.std().item<double>(); };
  EXPECT_NEAR(sd(model->embedding->weight), std, 0.03 * std);
  const auto& attention = model->blocks[1]->as<cqk::Block>()->attention;
  EXPECT_NEAR(sd(attention->q_proj->weight), std, 0.03 * std);
  EXPECT_NEAR(sd(attention->out_proj->weight), residual, 0.03 * residual);
  EXPECT_NEAR(sd(model->blocks[1]->as<cqk::Block>()->mlp->down->weight), residual, 0.03 * residual);
  // 4 vectors of 64 lambdas in each of 4 layers: a looser check.
  std::vector<at::Tensor> lambdas;
  for (const auto& item : model->named_parameters())
    if (item.key().find(".lambda_") != std::string::npos) lambdas.push_back(item.value().flatten());
  EXPECT_NEAR(sd(at::cat(lambdas)), cqk::kDifferentialLambdaInitStd, 0.1 * cqk::kDifferentialLambdaInitStd);
  // The conditioners' first layers: U(-b, b), b = 1/sqrt(fan_in), sd b/sqrt(3).
  for (const auto& item : model->named_parameters()) {
    if (item.key().find(".coupling.") == std::string::npos || item.key().find(".w1") == std::string::npos) continue;
    const double bound = 1.0 / std::sqrt(static_cast<double>(item.value().size(-1)));
    EXPECT_LE(item.value().abs().max().item<double>(), bound) << item.key();
    EXPECT_NEAR(sd(item.value()), bound / std::sqrt(3.0), 0.15 * bound / std::sqrt(3.0)) << item.key();
  }
}

TEST(Initialisation, CoupledModelAtInitComputesTheBaseModelsLogits) {
  at::manual_seed(5);
  const auto tokens = at::randint(0, 40, {2, 16}, at::kLong);
  for (const auto& attention : kAttentionKinds) {
    cqk::TransformerLM base(tiny(attention, "none"), 7);
    cqk::TransformerLM coupled(tiny(attention, "affine"), 7);
    at::NoGradGuard no_grad;
    const auto a = base->forward(tokens), b = coupled->forward(tokens);
    // Bitwise on the CPU: the identity coupling computes q * exp(0) + 0 = q
    // exactly, and the coupled path's RoPE (fused with the coupling) rounds
    // as the base's does. Not checked on CUDA, whose kernels may differ by ulps.
    EXPECT_TRUE(at::equal(a, b)) << attention << ": max difference " << (a - b).abs().max().item<double>();
  }
}

TEST(Initialisation, TheBatchStreamOfASeedDoesNotDependOnTheModel) {
  auto base_config = cqk::default_config({"model.attention.coupling.kind=none", "run.seed=4"});
  auto coupled_config = cqk::default_config({"model.attention.coupling.kind=affine", "run.seed=4",
                                                   "model.attention.kind=diff"});
  // In the trainer's order, the model built after the source, each drawing from torch's generator.
  at::manual_seed(4);
  auto base_source = cqk::make_batch_source(base_config.data, base_config.run.seed);
  base_config.model.vocab_size = base_source->vocab_size();
  cqk::TransformerLM base(base_config.model);
  at::manual_seed(4);
  auto coupled_source = cqk::make_batch_source(coupled_config.data, coupled_config.run.seed);
  coupled_config.model.vocab_size = coupled_source->vocab_size();
  cqk::TransformerLM coupled(coupled_config.model);
  for (int n = 0; n < 5; ++n) {
    const auto a = base_source->next_train(), b = coupled_source->next_train();
    (void)at::randn({17});  // a model's step drawing random numbers must not shift the stream
    EXPECT_TRUE(at::equal(a.inputs, b.inputs)) << "batch " << n;
    EXPECT_TRUE(at::equal(a.targets, b.targets)) << "batch " << n;
  }
}

}  // namespace
