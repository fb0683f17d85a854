#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>

#include "cqk/coupling_diagnostics.h"
#include "cqk/model.h"

// coupling_diagnostics.h against independent references: the log-determinant
// of the Jacobian built column by column with autograd in float64, the
// log-scale of a conditioner whose output is a known constant, and norms
// taken from the coupling's own forward.
namespace {

using cqk::CouplingKind;
using cqk::CouplingOptions;
using cqk::QKCoupling;

void randomise(QKCoupling& coupling, double scale) {
  at::NoGradGuard no_grad;
  for (auto& p : coupling->parameters()) p.copy_(at::randn_like(p) * scale);
}

// log |det d(q', k')/d(q, k)| per (batch, head, token) of a coupling on float64
// inputs [batch, heads, time, d]: the map acts on each token and head alone,
// so its Jacobian over all inputs is block diagonal with 2d x 2d blocks.
at::Tensor reference_log_det(const QKCoupling& coupling, const at::Tensor& q, const at::Tensor& k) {
  const int64_t d = q.size(3);
  auto qv = q.clone().requires_grad_(true), kv = k.clone().requires_grad_(true);
  const auto [q_out, k_out] = coupling->transform(qv, kv);
  const auto out = at::cat({q_out, k_out}, -1);  // [B, H, T, 2d]
  std::vector<at::Tensor> columns;                // d out_i / d (q, k), for each output i
  for (int64_t i = 0; i < 2 * d; ++i) {
    auto select = at::zeros_like(out);
    select.select(3, i).fill_(1.0);
    const auto grads = torch::autograd::grad({out}, {qv, kv}, {select}, /*retain_graph=*/true);
    columns.push_back(at::cat({grads[0], grads[1]}, -1));  // row i of each block: [B, H, T, 2d]
  }
  const auto jacobian = at::stack(columns, -2);  // [B, H, T, 2d, 2d]
  return std::get<1>(at::linalg_slogdet(jacobian));
}

TEST(CouplingDiagnostics, IdentityAtInitMovesNothing) {
  at::manual_seed(0);
  const auto q = at::randn({2, 3, 5, 8}), k = at::randn({2, 3, 5, 8});
  for (auto kind : {CouplingKind::Affine, CouplingKind::Dynamics, CouplingKind::NonInvertible}) {
    QKCoupling coupling(CouplingOptions(kind, 3, 8).hidden(4));
    const auto d = cqk::coupling_diagnostics(*coupling, q, k);
    EXPECT_EQ(d.q_change, 0.0) << cqk::to_string(kind);
    EXPECT_EQ(d.k_change, 0.0) << cqk::to_string(kind);
    // What is known of each kind: log-scales for affine, the volume for the invertible kinds.
    EXPECT_EQ(d.mean_abs_log_scale.has_value(), kind == CouplingKind::Affine) << cqk::to_string(kind);
    EXPECT_EQ(d.mean_log_det.has_value(), kind != CouplingKind::NonInvertible) << cqk::to_string(kind);
    if (d.mean_log_det) EXPECT_EQ(*d.mean_log_det, 0.0) << cqk::to_string(kind);
  }
}

TEST(CouplingDiagnostics, LogDeterminantMatchesTheJacobianInFloat64) {
  at::manual_seed(1);
  for (auto kind : {CouplingKind::Affine, CouplingKind::Dynamics}) {
    QKCoupling coupling(CouplingOptions(kind, 2, 4).hidden(3).steps(3));
    randomise(coupling, 0.8);
    const auto q = at::randn({2, 2, 3, 4}), k = at::randn({2, 2, 3, 4});
    const auto d = cqk::coupling_diagnostics(*coupling, q, k);
    coupling->to(at::kDouble);
    const double expected = reference_log_det(coupling, q.to(at::kDouble), k.to(at::kDouble)).mean().item<double>();
    ASSERT_TRUE(d.mean_log_det) << cqk::to_string(kind);
    // The diagnostics run in float32; the reference in float64.
    EXPECT_NEAR(*d.mean_log_det, expected, 1e-4 * std::max(1.0, std::abs(expected))) << cqk::to_string(kind);
    if (kind == CouplingKind::Affine) EXPECT_GT(std::abs(expected), 0.1);  // the check is not trivially 0 = 0
  }
}

TEST(CouplingDiagnostics, MeanAbsLogScaleOfAConstantConditioner) {
  // Output weights zero and output bias b: every step's log-scale is the
  // soft-clamped clamp * tanh(b / clamp), whatever the input.
  const double bias = -1.5, clamp = 2.0, d = 8, steps = 2;
  QKCoupling coupling(CouplingOptions(CouplingKind::Affine, 3, 8).hidden(4).clamp(clamp));
  {
    at::NoGradGuard no_grad;
    for (auto& item : coupling->named_parameters())
      if (item.key().find("b2") != std::string::npos) item.value().narrow(-1, 0, 8).fill_(bias);
  }
  at::manual_seed(2);
  const auto d_out = cqk::coupling_diagnostics(*coupling, at::randn({2, 3, 5, 8}), at::randn({2, 3, 5, 8}));
  const double s = clamp * std::tanh(bias / clamp);
  EXPECT_NEAR(*d_out.mean_abs_log_scale, std::abs(s), 1e-6);
  EXPECT_NEAR(*d_out.mean_log_det, steps * d * s, 1e-4);
}

TEST(CouplingDiagnostics, RelativeChangeIsTheNormOfWhatForwardChanged) {
  at::manual_seed(3);
  QKCoupling coupling(CouplingOptions(CouplingKind::Uncoupled, 2, 8).hidden(4));
  randomise(coupling, 0.3);
  const auto q = at::randn({2, 2, 6, 8}), k = at::randn({2, 2, 6, 8});
  at::Tensor q_out, k_out;
  {
    at::NoGradGuard no_grad;
    std::tie(q_out, k_out) = coupling->forward(q, k);
  }
  const auto d = cqk::coupling_diagnostics(*coupling, q, k);
  EXPECT_NEAR(d.q_change, ((q_out - q).norm() / q.norm()).item<double>(), 1e-6);
  EXPECT_NEAR(d.k_change, ((k_out - k).norm() / k.norm()).item<double>(), 1e-6);
  EXPECT_GT(d.q_change, 0.01);
}

cqk::ModelConfig tiny_model(const std::string& attention, const std::string& coupling) {
  cqk::ModelConfig config;
  config.vocab_size = 16;
  config.width = 32;
  config.heads = 4;
  config.layers = 3;
  config.attention.kind() = cqk::parse_attention_kind(attention);
  config.attention.coupling().kind() = cqk::parse_coupling_kind(coupling);
  config.attention.mta().every() = 2;  // MTA in layer 1 (the default 4 skips all 3)
  return config;
}

// The walk over the layers feeds each coupling what the attention feeds it:
// perturbing one layer's coupling moves that layer alone (the layers before
// see the same residual stream), for each layout of the coupling's inputs.
TEST(CouplingDiagnostics, ModelReportsEachLayerOfEveryLayout) {
  struct Case {
    std::string attention;
    int64_t kv_heads;
    bool separate_pairs;
  };
  for (const auto& c : {Case{"vanilla", 0, false}, Case{"vanilla", 2, false}, Case{"diff", 0, false},
                        Case{"diff", 0, true}, Case{"qknorm", 0, false}, Case{"mta", 0, false}}) {
    const std::string name = c.attention + " kv " + std::to_string(c.kv_heads) + (c.separate_pairs ? " separate" : "");
    auto config = tiny_model(c.attention, "affine");
    config.kv_heads = c.kv_heads;
    config.attention.coupling().separate_pairs() = c.separate_pairs;
    at::manual_seed(4);
    cqk::TransformerLM model(config);
    auto& middle = *model->blocks[1]->as<cqk::Block>()->attention->coupling_;
    {
      at::NoGradGuard no_grad;
      for (auto& p : middle.parameters()) p.copy_(at::randn_like(p) * 0.3);
    }
    const auto tokens = at::randint(0, 16, {2, 7});
    const auto layers = cqk::coupling_diagnostics(model, tokens);
    ASSERT_EQ(layers.size(), 3u) << name;
    for (int64_t i = 0; i < 3; ++i) {
      EXPECT_EQ(layers[i].layer, i) << name;
      EXPECT_EQ(layers[i].q_change > 0.0, i == 1) << name << " layer " << i;
      EXPECT_EQ(layers[i].k_change > 0.0, i == 1) << name << " layer " << i;
    }
    // Layer 1's numbers are its coupling's on the inputs the attention gives it.
    auto& block0 = *model->blocks[0]->as<cqk::Block>();
    auto& block1 = *model->blocks[1]->as<cqk::Block>();
    at::NoGradGuard no_grad;
    const auto h = block0.forward(model->embedding(tokens));
    const auto [q, k] = block1.attention->coupling_inputs(block1.attention_norm(h));
    EXPECT_EQ(q.size(1), middle.options().num_heads()) << name;
    const auto direct = cqk::coupling_diagnostics(middle, q, k);
    EXPECT_DOUBLE_EQ(layers[1].q_change, direct.q_change) << name;
    EXPECT_DOUBLE_EQ(*layers[1].mean_log_det, *direct.mean_log_det) << name;
  }
  cqk::TransformerLM uncoupled(tiny_model("vanilla", "none"));
  EXPECT_TRUE(cqk::coupling_diagnostics(uncoupled, at::zeros({1, 3}, at::kLong)).empty());
}

}  // namespace
