#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "cqk/attention.h"
#include "gradient_check.h"

namespace {

using cqk::Attention;
using cqk::AttentionKind;
using cqk::AttentionOptions;
using cqk::CouplingKind;

// Every kind, from the enums' tables: a new kind is tested here without being listed.
const std::vector<AttentionKind> kAttentionKinds = [] {
  std::vector<AttentionKind> kinds;
  for (const auto& name : cqk::attention_kind_names()) kinds.push_back(cqk::parse_attention_kind(name));
  return kinds;
}();
const std::vector<CouplingKind> kCouplingKinds = [] {
  std::vector<CouplingKind> kinds;
  for (const auto& name : cqk::coupling_kind_names()) kinds.push_back(cqk::parse_coupling_kind(name));
  return kinds;
}();

AttentionOptions small(AttentionKind kind, CouplingKind coupling = CouplingKind::None) {
  auto options = AttentionOptions(32, 4).kind(kind).layer_index(2);
  options.mta(cqk::MultiTokenOptions().query_kernel(3).key_kernel(3).head_group(2));
  options.coupling(cqk::CouplingOptions().kind(coupling).hidden(4));
  return options;
}

// Copies the parameters two modules have in common (same name and shape).
void copy_shared_parameters(const Attention& from, Attention& to) {
  at::NoGradGuard no_grad;
  auto source = from->named_parameters();
  for (auto& item : to->named_parameters()) {
    if (const auto* match = source.find(item.key()); match && match->sizes() == item.value().sizes())
      item.value().copy_(*match);
  }
}

// Non-identity coupling, MTA kernel and mixing, so that every part matters.
void randomise_extra_parameters(Attention& attention) {
  at::NoGradGuard no_grad;
  for (auto& item : attention->named_parameters()) {
    const auto& name = item.key();
    if (name.rfind("coupling", 0) == 0 || name.rfind("mta", 0) == 0)
      item.value().copy_(at::randn_like(item.value()) * 0.3);
  }
}

TEST(Attention, CouplingAtInitLeavesEveryMechanismExactlyUnchanged) {
  for (auto kind : kAttentionKinds) {
    at::manual_seed(0);
    Attention base(small(kind));
    const auto x = at::randn({2, 9, 32});
    const auto expected = base->forward(x);
    // Every coupling kind of the table (none included: trivially the base), so a new kind is covered.
    for (const auto& coupling_name : cqk::coupling_kind_names()) {
      const auto coupling = cqk::parse_coupling_kind(coupling_name);
      Attention coupled(small(kind, coupling));
      copy_shared_parameters(base, coupled);
      EXPECT_TRUE(at::equal(coupled->forward(x), expected))
          << cqk::to_string(kind) << " + " << cqk::to_string(coupling);
    }
  }
}

TEST(Attention, LaterTokensNeverChangeEarlierOutputs) {
  for (auto kind : kAttentionKinds) {
    at::manual_seed(1);
    Attention attention(small(kind, CouplingKind::Affine));
    attention->to(at::kDouble);
    randomise_extra_parameters(attention);
    const auto x = at::randn({2, 10, 32}, at::kDouble);
    const auto out = attention->forward(x);
    for (int64_t t : {0, 4, 8}) {
      auto changed = x.clone();
      changed.narrow(1, t + 1, 10 - t - 1).normal_();
      const auto out_changed = attention->forward(changed);
      EXPECT_TRUE(at::allclose(out.narrow(1, 0, t + 1), out_changed.narrow(1, 0, t + 1), 0, 1e-12))
          << cqk::to_string(kind) << " t=" << t;
      EXPECT_FALSE(at::allclose(out.narrow(1, t + 1, 1), out_changed.narrow(1, t + 1, 1)))
          << cqk::to_string(kind) << ": the change must reach position " << t + 1;
    }
  }
}

TEST(Attention, GradientsMatchFiniteDifferencesForEveryMechanismAndCoupling) {
  for (auto kind : kAttentionKinds) {
    for (auto coupling : kCouplingKinds) {
      at::manual_seed(2);
      Attention attention(small(kind, coupling));
      attention->to(at::kDouble);
      randomise_extra_parameters(attention);
      auto x = at::randn({1, 5, 32}, at::kDouble).requires_grad_();
      std::vector<at::Tensor> inputs{x};
      for (const auto& p : attention->parameters()) inputs.push_back(p);
      const auto result =
          cqk::testing::check_gradients([&] { return attention->forward(x); }, inputs, /*samples_per_input=*/4);
      EXPECT_TRUE(result.ok) << cqk::to_string(kind) << " + " << cqk::to_string(coupling) << ": " << result.report;
    }
  }
}

TEST(Attention, DifferentialLambdaInitFollowsTheSchedule) {
  for (int64_t layer : {0, 1, 5, 23})
    EXPECT_DOUBLE_EQ(cqk::differential_lambda_init(layer), 0.8 - 0.6 * std::exp(-0.3 * layer));
  EXPECT_NEAR(cqk::differential_lambda_init(0), 0.2, 1e-15);
}

// Differential attention against an explicit float64 computation of
// (softmax(q1 k1^T / sqrt(d)) - lambda softmax(q2 k2^T / sqrt(d))) v, per-head norm, scale.
TEST(Attention, DifferentialMatchesANaiveReference) {
  at::manual_seed(3);
  const int64_t width = 32, heads = 4, d = 8, time = 6;
  auto options = small(AttentionKind::Differential);
  options.rope(false);
  Attention attention(options);
  attention->to(at::kDouble);
  const auto x = at::randn({1, time, width}, at::kDouble);
  const auto q = attention->q_proj(x)[0].view({time, heads, d});
  const auto k = attention->k_proj(x)[0].view({time, heads, d});
  const auto v = attention->v_proj(x)[0].view({time, heads / 2, 2 * d});
  const double lambda_init = cqk::differential_lambda_init(2);
  const double lambda = std::exp((attention->lambda_q1 * attention->lambda_k1).sum().item<double>()) -
                        std::exp((attention->lambda_q2 * attention->lambda_k2).sum().item<double>()) + lambda_init;
  const auto mask = at::ones({time, time}, at::kBool).triu(1);
  std::vector<at::Tensor> heads_out;
  for (int64_t h = 0; h < heads / 2; ++h) {
    const auto attend = [&](int64_t pair) {
      const auto qh = q.select(1, 2 * h + pair), kh = k.select(1, 2 * h + pair);
      const auto scores = at::matmul(qh, kh.t()) / std::sqrt(static_cast<double>(d));
      return at::softmax(scores.masked_fill(mask, -std::numeric_limits<double>::infinity()), -1);
    };
    auto out = at::matmul(attend(0) - lambda * attend(1), v.select(1, h));
    out = out * at::rsqrt(out.pow(2).mean(-1, true) + 1e-5) * (1 - lambda_init);
    heads_out.push_back(out);
  }
  const auto expected = attention->out_proj(at::cat(heads_out, -1));
  EXPECT_TRUE(at::allclose(attention->forward(x)[0], expected, 1e-10, 1e-12));
}

// Differential's and MTA's per-head output norm starts at head_norm_init (1, the papers', unless set).
TEST(Attention, HeadNormStartsAtItsConfiguredWeight) {
  for (const auto kind : {AttentionKind::Differential, AttentionKind::MultiToken}) {
    const auto by_default = Attention(small(kind))->head_norm->weight;
    EXPECT_TRUE(at::equal(by_default, at::ones_like(by_default))) << cqk::to_string(kind);
    const auto set = Attention(small(kind).head_norm_init(0.05))->head_norm->weight;
    EXPECT_TRUE(at::equal(set, at::full_like(set, 0.05))) << cqk::to_string(kind);
    EXPECT_TRUE(set.requires_grad());
  }
}

TEST(Attention, MultiTokenConvolutionIsTheIdentityAtInit) {
  at::manual_seed(4);
  Attention attention(small(AttentionKind::MultiToken));
  const auto q = at::randn({2, 4, 7, 8}), k = at::randn({2, 4, 7, 8});
  const auto logits = attention->multi_token_logits(q, k);
  const auto expected = at::matmul(q, k.transpose(-1, -2)) / std::sqrt(8.0);
  const auto past = at::ones({7, 7}, at::kBool).tril();
  EXPECT_TRUE(at::allclose(logits.masked_select(past), expected.masked_select(past), 1e-6, 1e-6));
  EXPECT_TRUE(at::isinf(logits.masked_select(~past)).all().item<bool>());
  // Another kind has no convolution kernel to apply.
  Attention vanilla(small(AttentionKind::Vanilla));
  try {
    vanilla->multi_token_logits(q, k);
    ADD_FAILURE() << "multi_token_logits ran on vanilla attention";
  } catch (const std::logic_error& e) {
    EXPECT_EQ(std::string(e.what()), "multi_token_logits: the attention is vanilla, not mta");
  }
}

TEST(Attention, GroupedQueryHeadsShareKeysAndValues) {
  at::manual_seed(5);
  auto options = small(AttentionKind::Vanilla, CouplingKind::Affine).num_kv_heads(2);
  Attention attention(options);
  EXPECT_EQ(attention->k_proj->weight.size(0), 2 * 8);
  EXPECT_EQ(attention->forward(at::randn({2, 5, 32})).sizes(), (std::vector<int64_t>{2, 5, 32}));
}

TEST(Attention, BadOptionsGiveClearErrors) {
  EXPECT_THROW(Attention(AttentionOptions(30, 4)), std::invalid_argument);
  EXPECT_THROW(Attention(AttentionOptions(32, 4).num_kv_heads(3)), std::invalid_argument);
  EXPECT_THROW(Attention(AttentionOptions(24, 3).kind(AttentionKind::Differential)), std::invalid_argument);
  Attention attention(small(AttentionKind::Vanilla));
  EXPECT_THROW(attention->forward(at::randn({2, 5, 16})), std::invalid_argument);
  try {
    auto nan_clamp = AttentionOptions(32, 4);
    nan_clamp.coupling().clamp(std::nan(""));
    Attention{nan_clamp};
    ADD_FAILURE() << "a NaN clamp was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "attention: model.attention.coupling.clamp: must be positive and finite, got nan");
  }
}

}  // namespace
