#include "cqk/parameter_count.h"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "cqk/model.h"

// count_parameters(config) must equal what the built model reports, category
// by category, for every attention kind x every coupling kind and the options
// that change the count.
namespace {

struct Case {
  std::string label;
  cqk::ModelConfig config;
};

cqk::ModelConfig small_config(const std::string& attention, const std::string& coupling) {
  cqk::ModelConfig c;
  c.vocab_size = 53;
  c.width = 32;
  c.layers = 3;
  c.heads = 4;
  c.attention.kind() = cqk::parse_attention_kind(attention);
  c.attention.coupling().kind() = cqk::parse_coupling_kind(coupling);
  c.attention.coupling().hidden() = 4;
  c.attention.mta().every() = 2;
  c.attention.mta().query_kernel() = 3;
  c.attention.mta().key_kernel() = 5;
  c.attention.mta().head_group() = 2;
  return c;
}

std::vector<Case> grid() {
  std::vector<Case> cases;
  for (const std::string& attention : cqk::attention_kind_names()) {
    for (const std::string& coupling : cqk::coupling_kind_names()) {
      const std::string label = attention + "/" + coupling;
      auto base = small_config(attention, coupling);
      cases.push_back({label, base});

      auto gelu = base;
      gelu.mlp = cqk::MlpKind::Gelu;
      cases.push_back({label + "/gelu", gelu});

      auto hidden = base;
      hidden.mlp_hidden = 40;
      hidden.width = 48;  // swiglu default hidden 128; explicit 40
      cases.push_back({label + "/mlp_hidden=40,width=48", hidden});

      auto shared = base;
      shared.attention.coupling().shared_across_heads() = true;
      cases.push_back({label + "/shared", shared});

      auto steps = base;
      steps.attention.coupling().steps() = 3;
      steps.attention.coupling().hidden() = 7;
      cases.push_back({label + "/steps=3,hidden=7", steps});

      if (attention == "diff") {
        auto separate = base;
        separate.attention.coupling().separate_pairs() = true;
        cases.push_back({label + "/separate_pairs", separate});
        auto six = base;
        six.heads = 8;  // 4 differential heads, each of two pairs of size 4
        cases.push_back({label + "/heads=8", six});
      } else {
        auto gqa = base;
        gqa.kv_heads = 2;
        cases.push_back({label + "/gqa kv_heads=2", gqa});
        auto mqa = base;
        mqa.kv_heads = 1;
        mqa.attention.mta().head_group() = 4;
        cases.push_back({label + "/mqa kv_heads=1,head_group=4", mqa});
      }
      if (attention == "mta") {
        auto every1 = base;
        every1.attention.mta().every() = 1;
        cases.push_back({label + "/every=1", every1});
        auto every3 = base;
        every3.attention.mta().every() = 3;  // the last of 3 layers only
        cases.push_back({label + "/every=3", every3});
      }
    }
  }
  return cases;
}

// An MTA model whose every skips all its layers would be vanilla attention
// under another name: refused, where a config is checked and where a model is built.
TEST(ParameterCount, AnMtaModelWithoutAnMtaLayerIsRefused) {
  auto config = small_config("mta", "none");  // 3 layers
  config.attention.mta().every() = 4;
  const auto problem = cqk::model_shape_problem(config);
  ASSERT_TRUE(problem.has_value());
  EXPECT_EQ(problem->key, "model.attention.mta.every");
  EXPECT_NE(problem->what.find("none would use MTA"), std::string::npos) << problem->what;
  EXPECT_THROW(cqk::TransformerLM{config}, std::invalid_argument);
  config.attention.mta().every() = 3;
  EXPECT_FALSE(cqk::model_shape_problem(config).has_value());
}

TEST(ParameterCount, MatchesTheBuiltModelForEveryKind) {
  const auto cases = grid();
  ASSERT_GE(cases.size(), 100u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    const auto counted = cqk::parameter_breakdown(c.config);
    cqk::TransformerLM model(c.config);
    const auto built = model->parameter_breakdown();
    EXPECT_EQ(counted.embedding, built.embedding);
    EXPECT_EQ(counted.attention, built.attention);
    EXPECT_EQ(counted.coupling, built.coupling);
    EXPECT_EQ(counted.mlp, built.mlp);
    EXPECT_EQ(counted.norm, built.norm);
    EXPECT_EQ(cqk::count_parameters(c.config), built.total());
    int64_t numel = 0;
    for (const auto& p : model->parameters()) numel += p.numel();
    EXPECT_EQ(cqk::count_parameters(c.config), numel);
    if (c.config.attention.coupling().kind() != cqk::CouplingKind::None) {
      EXPECT_GT(counted.coupling, 0);
    } else {
      EXPECT_EQ(counted.coupling, 0);
    }
  }
}

TEST(ParameterCount, ControlsMatchAffineWithinFivePercent) {
  // At the paper's head size 64 and r = 8 (at tiny head sizes the integer
  // widths of the controls cannot get within 5%).
  const auto config = [](const std::string& attention, const std::string& coupling) {
    auto c = small_config(attention, coupling);
    c.width = 256;
    c.attention.coupling().hidden() = 8;
    return c;
  };
  for (const std::string attention : {"vanilla", "diff"}) {
    const auto affine = cqk::parameter_breakdown(config(attention, "affine")).coupling;
    for (const std::string control : {"noninvertible", "uncoupled", "dynamics"}) {
      SCOPED_TRACE(attention + "/" + control);
      const auto count = cqk::parameter_breakdown(config(attention, control)).coupling;
      EXPECT_NEAR(static_cast<double>(count) / static_cast<double>(affine), 1.0, 0.05);
    }
  }
}

TEST(ParameterCount, ClosedFormAtPaperScaleWithoutBuilding) {
  // The 150M vanilla model of configs/wikitext103: width 768, 18 layers, 12
  // heads of 64, SwiGLU hidden 2048, vocabulary 32000.
  cqk::ModelConfig c;
  c.vocab_size = 32000;
  c.width = 768;
  c.layers = 18;
  c.heads = 12;
  c.attention.coupling().kind() = cqk::CouplingKind::None;
  const auto start = std::chrono::steady_clock::now();
  const int64_t expected = 32000LL * 768 + 18LL * (4 * 768 * 768 + 3 * 768 * 2048 + 2 * 768) + 768;
  EXPECT_EQ(cqk::count_parameters(c), expected);
  EXPECT_EQ(cqk::mlp_hidden_size(c), 2048);
  // Affine coupling: r(3d+1) + 2d = 8 * 193 + 128 = 1672 per step per head, two steps.
  c.attention.coupling().kind() = cqk::CouplingKind::Affine;
  EXPECT_EQ(cqk::parameter_breakdown(c).coupling, 18LL * 12 * 2 * 1672);
  // Differential shares one coupling across its two pairs: half the heads.
  c.attention.kind() = cqk::AttentionKind::Differential;
  EXPECT_EQ(cqk::parameter_breakdown(c).coupling, 18LL * 6 * 2 * 1672);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

TEST(ParameterCount, DefaultSwigluHiddenRoundsUpTo64) {
  cqk::ModelConfig c;
  c.width = 512;
  EXPECT_EQ(cqk::mlp_hidden_size(c), 1408);  // 8/3 * 512 = 1365.3 -> 1408
  c.width = 1280;
  EXPECT_EQ(cqk::mlp_hidden_size(c), 3456);  // 3413.3 -> 3456
  c.mlp = cqk::MlpKind::Gelu;
  EXPECT_EQ(cqk::mlp_hidden_size(c), 5120);
  c.mlp_hidden = 100;
  EXPECT_EQ(cqk::mlp_hidden_size(c), 100);
}

TEST(ParameterCount, RejectsConfigsThatDescribeNoModel) {
  auto c = small_config("vanilla", "none");
  c.vocab_size = 0;  // "from the data"
  EXPECT_THROW(cqk::count_parameters(c), std::invalid_argument);
  c = small_config("vanilla", "none");
  c.heads = 5;
  EXPECT_THROW(cqk::count_parameters(c), std::invalid_argument);
  c = small_config("diff", "none");
  c.kv_heads = 2;
  EXPECT_THROW(cqk::count_parameters(c), std::invalid_argument);
  c = small_config("mta", "none");
  c.attention.mta().head_group() = 3;
  EXPECT_THROW(cqk::count_parameters(c), std::invalid_argument);
  // An unknown kind cannot be held by a ModelConfig (an enum): naming it throws.
  EXPECT_THROW(small_config("vanilla", "afine"), std::invalid_argument);
}

}  // namespace
