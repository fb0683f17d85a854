// The __host__ __device__ math of the flash coupled-attention kernels
// (kernels/flash_math.cuh), compiled as plain C++ and driven through the same
// tiling as kernels/attention_kernels.cu: the forward's online softmax over key
// tiles and the backward's walk over the query tiles that see a key tile, both
// against causal attention computed naively in float64 (forward values, and
// gradients by autograd); the same for differential attention's two maps in
// one launch (both pairs read one v, the backward sums both pairs' dv in the
// block that owns a key tile). Also the causal tile bounds, the steps a tile
// needs, the coupling weights each pair uses, and RoPE per channel with its
// transpose.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>
#include <vector>

#include "coupling_math.cuh"
#include "cqk/coupling.h"
#include "cqk/rope.h"
#include "flash_math.cuh"
#include "rope_math.cuh"
#include "tools/tensor_compare.h"

namespace {

namespace kn = cqk::kernels;

// Rows of a [time, dim] float32 matrix.
struct Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<float> data;
  Matrix(int64_t r, int64_t c) : rows(r), cols(c), data(static_cast<size_t>(r * c), 0.0f) {}
  explicit Matrix(const at::Tensor& t) : Matrix(t.size(0), t.size(1)) {
    const auto c = t.to(at::kFloat).contiguous();
    std::copy(c.data_ptr<float>(), c.data_ptr<float>() + c.numel(), data.begin());
  }
  float* row(int64_t i) { return data.data() + i * cols; }
  const float* row(int64_t i) const { return data.data() + i * cols; }
  at::Tensor tensor() const { return at::tensor(data).reshape({rows, cols}).to(at::kDouble); }
};

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t c = 0; c < n; ++c) sum += a[c] * b[c];
  return sum;
}

// s2 = log2(e) * scale * q.k, as the kernels score (scale folded into q).
float score2(const Matrix& q, int64_t i, const Matrix& k, int64_t j, float scale) {
  return kn::kLog2e * scale * dot(q.row(i), k.row(j), q.cols);
}

struct ForwardResult {
  Matrix o;
  std::vector<float> lse2;
};

// The forward of attention_kernels.cu for one (batch, head): per query tile, the
// key tiles up to the diagonal, online softmax row by row.
ForwardResult tiled_forward(const Matrix& q, const Matrix& k, const Matrix& v, float scale) {
  const int64_t time = q.rows, dim = v.cols;
  ForwardResult out{Matrix(time, dim), std::vector<float>(static_cast<size_t>(time))};
  const int64_t query_tiles = (time + kn::kFlashQueryTile - 1) / kn::kFlashQueryTile;
  for (int64_t qt = 0; qt < query_tiles; ++qt) {
    for (int64_t i = qt * kn::kFlashQueryTile; i < std::min(time, (qt + 1) * kn::kFlashQueryTile); ++i) {
      kn::SoftmaxRow row;
      std::vector<float> acc(static_cast<size_t>(dim), 0.0f);
      for (int64_t kt = 0; kt < kn::causal_key_tiles(qt, time); ++kt) {
        const int64_t j0 = kt * kn::kFlashKeyTile, j1 = std::min(time, j0 + kn::kFlashKeyTile);
        float tile_max = -INFINITY;
        for (int64_t j = j0; j < j1; ++j)
          if (kn::causal_visible(i, j)) tile_max = std::max(tile_max, score2(q, i, k, j, scale));
        const float factor = kn::softmax_rescale(row, tile_max);
        for (auto& a : acc) a *= factor;
        float tile_sum = 0.0f;
        for (int64_t j = j0; j < j1; ++j) {
          const bool visible = kn::causal_visible(i, j);
          const float p = kn::softmax_weight(row, visible ? score2(q, i, k, j, scale) : 0.0f, visible);
          tile_sum += p;
          for (int64_t c = 0; c < dim; ++c) acc[static_cast<size_t>(c)] += p * v.row(j)[c];
        }
        kn::softmax_accumulate(row, tile_sum);
      }
      const float normaliser = kn::softmax_normaliser(row);
      for (int64_t c = 0; c < dim; ++c) out.o.row(i)[c] = acc[static_cast<size_t>(c)] * normaliser;
      out.lse2[static_cast<size_t>(i)] = kn::softmax_lse2(row);
    }
  }
  return out;
}

// delta_i = grad_o_i . o_i, the backward's row scratch.
std::vector<float> row_deltas(const Matrix& grad_o, const Matrix& o) {
  std::vector<float> delta(static_cast<size_t>(o.rows));
  for (int64_t i = 0; i < o.rows; ++i) delta[static_cast<size_t>(i)] = dot(grad_o.row(i), o.row(i), o.cols);
  return delta;
}

// One key tile of one pair in the backward of attention_kernels.cu: the query
// tiles from the first that sees it to the last, p rebuilt from lse2. Adds to
// dq, dk and dv.
void backward_key_tile(const Matrix& q, const Matrix& k, const Matrix& v, const Matrix& grad_o,
                       const std::vector<float>& lse2, const std::vector<float>& delta, float scale, int64_t kt,
                       Matrix& dq, Matrix& dk, Matrix& dv) {
  const int64_t time = q.rows, dim = q.cols;
  const int64_t query_tiles = (time + kn::kFlashQueryTile - 1) / kn::kFlashQueryTile;
  const int64_t j0 = kt * kn::kFlashKeyTile, j1 = std::min(time, j0 + kn::kFlashKeyTile);
  for (int64_t qt = kn::causal_first_query_tile(kt); qt < query_tiles; ++qt) {
    for (int64_t i = qt * kn::kFlashQueryTile; i < std::min(time, (qt + 1) * kn::kFlashQueryTile); ++i) {
      for (int64_t j = j0; j < j1; ++j) {
        const bool visible = kn::causal_visible(i, j);
        const float p = kn::flash_probability(visible ? score2(q, i, k, j, scale) : 0.0f,
                                              lse2[static_cast<size_t>(i)], visible);
        const float dp = dot(grad_o.row(i), v.row(j), v.cols);
        const float ds = kn::softmax_logit_grad(p, dp, delta[static_cast<size_t>(i)]);
        for (int64_t c = 0; c < dim; ++c) {
          dq.row(i)[c] += scale * ds * k.row(j)[c];
          dk.row(j)[c] += scale * ds * q.row(i)[c];
        }
        for (int64_t c = 0; c < v.cols; ++c) dv.row(j)[c] += p * grad_o.row(i)[c];
      }
    }
  }
}

int64_t key_tiles(int64_t time) { return (time + kn::kFlashKeyTile - 1) / kn::kFlashKeyTile; }

struct Gradients {
  std::vector<Matrix> dq, dk;  // per pair
  Matrix dv;                   // shared by the pairs
};

// The backward of attention_kernels.cu over the pairs of one head: one block
// per key tile walks the pairs one after the other, dk per pair, dv summed.
Gradients tiled_backward(const std::vector<Matrix>& q, const std::vector<Matrix>& k, const Matrix& v,
                         const std::vector<ForwardResult>& forward, const std::vector<Matrix>& grad_o, float scale) {
  const size_t pairs = q.size();
  Gradients g{{}, {}, Matrix(v.rows, v.cols)};
  std::vector<std::vector<float>> delta;
  for (size_t p = 0; p < pairs; ++p) {
    g.dq.emplace_back(q[p].rows, q[p].cols);
    g.dk.emplace_back(k[p].rows, k[p].cols);
    delta.push_back(row_deltas(grad_o[p], forward[p].o));
  }
  for (int64_t kt = 0; kt < key_tiles(v.rows); ++kt)
    for (size_t p = 0; p < pairs; ++p)
      backward_key_tile(q[p], k[p], v, grad_o[p], forward[p].lse2, delta[p], scale, kt, g.dq[p], g.dk[p], g.dv);
  return g;
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  const int64_t time = q.size(0);
  const auto mask = at::ones({time, time}, at::kBool).tril();
  const auto scores = at::matmul(q, k.t()).mul(scale).masked_fill(mask.logical_not(), -INFINITY);
  return at::matmul(at::softmax(scores, -1), v);
}

// Floored at 1: where every expected entry is 0 (one visible key: no gradient to q or k), the error is absolute.
double max_relative_error(const at::Tensor& actual, const at::Tensor& expected) {
  return cqk::testing::max_relative_error(actual, expected, /*floor=*/1.0);
}

class FlashMath : public ::testing::TestWithParam<int64_t> {};

// Lengths around the tile size: one partial tile, exact tiles, a partial last tile.
INSTANTIATE_TEST_SUITE_P(Lengths, FlashMath, ::testing::Values(1, 37, 64, 128, 150, 200));

TEST_P(FlashMath, TiledForwardAndBackwardMatchFloat64Attention) {
  const int64_t time = GetParam(), dim = 16;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  at::manual_seed(1000 + time);
  // Scores of a few units, so the online rescaling actually moves the maximum.
  const auto q64 = (at::randn({time, dim}, at::kDouble) * 1.5).requires_grad_();
  const auto k64 = (at::randn({time, dim}, at::kDouble) * 1.5).requires_grad_();
  const auto v64 = at::randn({time, dim}, at::kDouble).requires_grad_();
  const auto grad_o64 = at::randn({time, dim}, at::kDouble);
  const auto o64 = causal_attention(q64, k64, v64, scale);
  const auto grads = torch::autograd::grad({o64}, {q64, k64, v64}, {grad_o64});

  const Matrix q(q64.detach()), k(k64.detach()), v(v64.detach()), grad_o(grad_o64);
  const auto forward = tiled_forward(q, k, v, scale);
  EXPECT_LT(max_relative_error(forward.o.tensor(), o64.detach()), 1e-5);

  // lse2 = log2 of the row's sum of exp of the natural scores.
  const auto scores = at::matmul(q64.detach(), k64.detach().t()).mul(scale);
  const auto mask = at::ones({time, time}, at::kBool).tril();
  const auto lse2_expected = at::logsumexp(scores.masked_fill(mask.logical_not(), -INFINITY), -1) / std::log(2.0);
  const auto lse2 = at::tensor(forward.lse2).to(at::kDouble);
  EXPECT_LT((lse2 - lse2_expected).abs().max().item<double>(), 1e-4);

  const auto g = tiled_backward({q}, {k}, v, {forward}, {grad_o}, scale);
  EXPECT_LT(max_relative_error(g.dq[0].tensor(), grads[0]), 1e-4);
  EXPECT_LT(max_relative_error(g.dk[0].tensor(), grads[1]), 1e-4);
  EXPECT_LT(max_relative_error(g.dv.tensor(), grads[2]), 1e-4);
}

// Differential attention's two maps in one launch: both pairs (q_p, k_p) of
// head dim d read one v of head dim 2d; the forward runs per pair, the
// backward sums both pairs' dv in the key tile's block. Against autograd of
// A1 v and A2 v in float64.
TEST_P(FlashMath, PairsShareVAndTheBackwardSumsTheirDv) {
  const int64_t time = GetParam(), dim = 16, value_dim = 2 * dim, pairs = 2;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  at::manual_seed(2000 + time);
  const auto v64 = at::randn({time, value_dim}, at::kDouble).requires_grad_();
  std::vector<at::Tensor> q64, k64, grad_o64, outputs;
  for (int64_t p = 0; p < pairs; ++p) {
    q64.push_back((at::randn({time, dim}, at::kDouble) * 1.5).requires_grad_());
    k64.push_back((at::randn({time, dim}, at::kDouble) * 1.5).requires_grad_());
    grad_o64.push_back(at::randn({time, value_dim}, at::kDouble));
    outputs.push_back(causal_attention(q64.back(), k64.back(), v64, scale));
  }
  const auto grads = torch::autograd::grad(outputs, {q64[0], k64[0], q64[1], k64[1], v64}, grad_o64);

  const Matrix v(v64.detach());
  std::vector<Matrix> q, k, grad_o;
  std::vector<ForwardResult> forward;
  for (int64_t p = 0; p < pairs; ++p) {
    q.emplace_back(q64[p].detach());
    k.emplace_back(k64[p].detach());
    grad_o.emplace_back(grad_o64[p]);
    forward.push_back(tiled_forward(q[p], k[p], v, scale));
    EXPECT_LT(max_relative_error(forward[p].o.tensor(), outputs[p].detach()), 1e-5) << "pair " << p;
  }
  const auto g = tiled_backward(q, k, v, forward, grad_o, scale);
  for (int64_t p = 0; p < pairs; ++p) {
    EXPECT_LT(max_relative_error(g.dq[p].tensor(), grads[2 * p]), 1e-4) << "pair " << p;
    EXPECT_LT(max_relative_error(g.dk[p].tensor(), grads[2 * p + 1]), 1e-4) << "pair " << p;
  }
  EXPECT_LT(max_relative_error(g.dv.tensor(), grads[4]), 1e-4);
  // Both pairs contribute: one pair's dv alone is far from the sum.
  const auto first_only = tiled_backward({q[0]}, {k[0]}, v, {forward[0]}, {grad_o[0]}, scale);
  if (time > 1) EXPECT_GT(max_relative_error(first_only.dv.tensor(), grads[4]), 1e-2);
}

// Large scores: exp of the raw scores would overflow float32; the online
// softmax must not.
TEST(FlashMathSoftmax, LargeScoresStayFinite) {
  const int64_t time = 130, dim = 8;
  at::manual_seed(7);
  const auto q64 = at::randn({time, dim}, at::kDouble) * 40.0, k64 = at::randn({time, dim}, at::kDouble) * 40.0;
  const auto v64 = at::randn({time, dim}, at::kDouble);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  const auto forward = tiled_forward(Matrix(q64), Matrix(k64), Matrix(v64), scale);
  const auto expected = causal_attention(q64, k64, v64, scale);
  EXPECT_TRUE(forward.o.tensor().isfinite().all().item<bool>());
  EXPECT_LT(max_relative_error(forward.o.tensor(), expected), 1e-3);
}

TEST(FlashMathSoftmax, RowThatSeesNothingGivesZeroOutputAndZeroProbabilities) {
  kn::SoftmaxRow row;
  EXPECT_EQ(kn::softmax_rescale(row, -INFINITY), 1.0f);
  EXPECT_EQ(row.max, -INFINITY);
  EXPECT_EQ(kn::softmax_weight(row, 3.0f, /*visible=*/false), 0.0f);
  EXPECT_EQ(kn::softmax_normaliser(row), 0.0f);
  const float lse2 = kn::softmax_lse2(row);
  EXPECT_EQ(kn::flash_probability(100.0f, lse2, /*visible=*/true), 0.0f);
}

// Every visible (query, key) pair is visited exactly once by each pass, and no
// tile is visited that holds nothing visible.
TEST(FlashMathTiling, CausalTileBoundsVisitEveryVisiblePairOnce) {
  for (int64_t time = 1; time <= 300; ++time) {
    const int64_t query_tiles = (time + kn::kFlashQueryTile - 1) / kn::kFlashQueryTile;
    const int64_t key_tiles = (time + kn::kFlashKeyTile - 1) / kn::kFlashKeyTile;
    std::vector<int> forward(static_cast<size_t>(time * time), 0), backward(forward.size(), 0);
    for (int64_t qt = 0; qt < query_tiles; ++qt) {
      const int64_t tiles = kn::causal_key_tiles(qt, time);
      ASSERT_LE(tiles, key_tiles);
      for (int64_t kt = 0; kt < tiles; ++kt) {
        bool any = false;
        for (int64_t i = qt * kn::kFlashQueryTile; i < std::min(time, (qt + 1) * kn::kFlashQueryTile); ++i)
          for (int64_t j = kt * kn::kFlashKeyTile; j < std::min(time, (kt + 1) * kn::kFlashKeyTile); ++j)
            if (kn::causal_visible(i, j)) ++forward[static_cast<size_t>(i * time + j)], any = true;
        EXPECT_TRUE(any) << "time " << time << " query tile " << qt << " key tile " << kt;
      }
    }
    for (int64_t kt = 0; kt < key_tiles; ++kt) {
      for (int64_t qt = kn::causal_first_query_tile(kt); qt < query_tiles; ++qt) {
        bool any = false;
        for (int64_t i = qt * kn::kFlashQueryTile; i < std::min(time, (qt + 1) * kn::kFlashQueryTile); ++i)
          for (int64_t j = kt * kn::kFlashKeyTile; j < std::min(time, (kt + 1) * kn::kFlashKeyTile); ++j)
            if (kn::causal_visible(i, j)) ++backward[static_cast<size_t>(i * time + j)], any = true;
        EXPECT_TRUE(any) << "time " << time << " key tile " << kt << " query tile " << qt;
      }
    }
    for (int64_t i = 0; i < time; ++i)
      for (int64_t j = 0; j < time; ++j) {
        const int expected = j <= i ? 1 : 0;
        ASSERT_EQ(forward[static_cast<size_t>(i * time + j)], expected) << "forward, time " << time;
        ASSERT_EQ(backward[static_cast<size_t>(i * time + j)], expected) << "backward, time " << time;
      }
  }
}

// A coupling's float32 weights for kn::affine_coupling_forward, every group
// of every step, as AffineCouplingParams lays them out ([groups, ...] per tensor).
class CouplingWeights {
 public:
  explicit CouplingWeights(cqk::QKCoupling& coupling) : options_(coupling->options()) {
    auto params = coupling->named_parameters();
    for (int64_t s = 0; s < options_.steps(); ++s)
      for (const char* name : {"w1", "b1", "w2", "b2"})
        storage_.push_back(Matrix(params["conditioner" + std::to_string(s) + "." + name].reshape({1, -1})).data);
  }
  // The steps of weight group g: pointers into this object.
  std::vector<kn::AffineStepWeights> group(int64_t g) const {
    const int64_t d = options_.head_dim(), r = options_.hidden();
    std::vector<kn::AffineStepWeights> steps;
    for (size_t s = 0; 4 * s < storage_.size(); ++s)
      steps.push_back({storage_[4 * s].data() + g * r * d, storage_[4 * s + 1].data() + g * r,
                       storage_[4 * s + 2].data() + g * 2 * d * r, storage_[4 * s + 3].data() + g * 2 * d});
    return steps;
  }

 private:
  cqk::CouplingOptions options_;
  std::vector<std::vector<float>> storage_;
};

void randomise(cqk::QKCoupling& coupling) {
  at::NoGradGuard no_grad;
  for (auto& p : coupling->parameters()) p.copy_(at::randn_like(p) * 0.15);
}

// Each pair's tokens, coupled with the weights coupling_weight_group picks,
// match the differential module's ATen coupling of [batch, 2, heads, time, d]:
// pairs folded into the batch (one coupling per head) or into the heads (one
// per pair and head, pair-major), or one coupling for all heads.
TEST(FlashMathPairs, CouplingWeightGroupMatchesTheDifferentialLayout) {
  constexpr int D = 64, R = 8;
  const int64_t batch = 2, pairs = 2, heads = 3, time = 5, steps = 2;
  for (bool separate : {false, true}) {
    for (bool shared_across_heads : {false, true}) {
      cqk::QKCoupling coupling(cqk::CouplingOptions(cqk::CouplingKind::Affine, separate ? pairs * heads : heads, D)
                                   .hidden(R)
                                   .steps(steps)
                                   .shared_across_heads(shared_across_heads));
      at::manual_seed(separate * 2 + shared_across_heads);
      randomise(coupling);
      const CouplingWeights weights(coupling);
      coupling->to(at::kDouble);
      const auto q = at::randn({batch, pairs, heads, time, D}), k = at::randn({batch, pairs, heads, time, D});
      const auto layout = [&](const at::Tensor& t) {
        return separate ? t.reshape({batch, pairs * heads, time, D}) : t.reshape({batch * pairs, heads, time, D});
      };
      auto [q_ref, k_ref] = coupling->transform(layout(q.to(at::kDouble)), layout(k.to(at::kDouble)));
      q_ref = q_ref.reshape(q.sizes());
      k_ref = k_ref.reshape(k.sizes());
      auto q_out = q.clone(), k_out = k.clone();
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t p = 0; p < pairs; ++p)
          for (int64_t h = 0; h < heads; ++h) {
            const auto group = weights.group(kn::coupling_weight_group(p, h, heads, separate, shared_across_heads));
            for (int64_t t = 0; t < time; ++t)
              kn::affine_coupling_forward<D, R>(q_out[b][p][h][t].data_ptr<float>(),
                                                k_out[b][p][h][t].data_ptr<float>(), group.data(), steps, 2.0f);
          }
      const std::string what = std::string(separate ? "separate" : "shared") + " pairs" +
                               (shared_across_heads ? ", one coupling for all heads" : "");
      EXPECT_LT(max_relative_error(q_out.to(at::kDouble), q_ref), 1e-5) << what;
      EXPECT_LT(max_relative_error(k_out.to(at::kDouble), k_ref), 1e-5) << what;
      EXPECT_GT(max_relative_error(q.to(at::kDouble), q_ref), 1e-2) << what << ": the coupling moved q";
    }
  }
}

// A key tile runs steps_for_keys(n) steps, a query tile steps_for_queries(n):
// the vector each needs comes out exactly as after all n steps.
TEST(FlashMathCoupling, TilesRunOnlyTheStepsTheirVectorNeeds) {
  constexpr int D = 64, R = 8;
  for (int steps : {1, 2, 3, 4}) {
    cqk::QKCoupling coupling(cqk::CouplingOptions(cqk::CouplingKind::Affine, /*num_heads=*/1, D).hidden(R).steps(steps));
    at::manual_seed(steps);
    randomise(coupling);
    const CouplingWeights all_weights(coupling);
    const auto weights = all_weights.group(0);
    const Matrix qk(at::randn({2, D}));
    std::vector<float> q_all(qk.row(0), qk.row(0) + D), k_all(qk.row(1), qk.row(1) + D);
    auto q_keys = q_all, k_keys = k_all, q_queries = q_all, k_queries = k_all;
    kn::affine_coupling_forward<D, R>(q_all.data(), k_all.data(), weights.data(), steps, 2.0f);
    kn::affine_coupling_forward<D, R>(q_keys.data(), k_keys.data(), weights.data(), kn::steps_for_keys(steps), 2.0f);
    kn::affine_coupling_forward<D, R>(q_queries.data(), k_queries.data(), weights.data(),
                                      kn::steps_for_queries(steps), 2.0f);
    EXPECT_EQ(k_keys, k_all) << steps << " steps";
    EXPECT_EQ(q_queries, q_all) << steps << " steps";
    EXPECT_NE(k_all, std::vector<float>(qk.row(1), qk.row(1) + D)) << "the coupling moved k";
  }
}

// rope_channel with the angles of the kernels' tables against cqk::apply_rope
// (what the default path runs), and its transpose (-sin) as the adjoint:
// <R x, y> == <x, R^T y>.
TEST(FlashMathRope, ChannelRotationMatchesApplyRopeAndItsTranspose) {
  constexpr int D = 16, Half = D / 2;
  constexpr int64_t kPosition = 5;
  const double base = 10000.0;
  at::manual_seed(3);
  const Matrix xy(at::randn({2, D}));
  const float* x = xy.row(0);
  const float* y = xy.row(1);
  const Matrix expected(cqk::apply_rope(xy.tensor().to(at::kFloat).narrow(0, 0, 1).view({1, 1, 1, D}), base, kPosition)
                            .view({1, D}));
  float rx[D], rty[D];
  double lhs = 0, rhs = 0;
  for (int c = 0; c < D; ++c) {
    const int i = c % Half;
    // As src/ops/fused_attention.cpp's tables: t * base^(-2i/D) in float64, then float.
    const double angle = static_cast<double>(kPosition) * std::pow(base, -2.0 * i / D);
    const float cos_a = static_cast<float>(std::cos(angle)), sin_a = static_cast<float>(std::sin(angle));
    const bool upper = c >= Half;
    const int partner = upper ? c - Half : c + Half;
    rx[c] = kn::rope_channel(x[c], x[partner], cos_a, sin_a, upper);
    rty[c] = kn::rope_channel(y[c], y[partner], cos_a, -sin_a, upper);
    EXPECT_NEAR(rx[c], expected.row(0)[c], 1e-6) << "channel " << c;
  }
  for (int c = 0; c < D; ++c) lhs += static_cast<double>(rx[c]) * y[c], rhs += static_cast<double>(x[c]) * rty[c];
  EXPECT_NEAR(lhs, rhs, 1e-5);
}

// rope_lane as the kernels run it, a token's channels spread over D/8 lanes
// whose exchange reads the partner lane (emulated from a snapshot of the row,
// as the warp shuffle reads the values before any lane writes), with the
// tables of cqk::rope_tables: it must give apply_rope's rotation, and the
// transpose must rotate it back.
template <int D>
void check_lane_split_rope() {
  constexpr int L = D / kn::kLaneChannels, T = 9;
  const double base = 500.0;
  at::manual_seed(D);
  const auto x = at::randn({T, D});
  const Matrix expected(cqk::apply_rope(x.view({1, 1, T, D}), base).view({T, D}));
  const auto [cos, sin] = cqk::rope_tables(T, D, base, at::kCPU);
  const kn::RopeTables tables{cos.data_ptr<float>(), sin.data_ptr<float>()};
  Matrix rows(x.clone());
  const auto rotate_rows = [&](bool transpose) {
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<float> snapshot(rows.row(t), rows.row(t) + D);
      for (int lane = 0; lane < L; ++lane) {
        const int c0 = lane * kn::kLaneChannels;
        const auto exchange = [&](const float (&)[kn::kLaneChannels], float (&partner)[kn::kLaneChannels]) {
          const int partner_c0 = (lane ^ (L / 2)) * kn::kLaneChannels;
          for (int i = 0; i < kn::kLaneChannels; ++i) partner[i] = snapshot[partner_c0 + i];
        };
        float v[kn::kLaneChannels];
        for (int i = 0; i < kn::kLaneChannels; ++i) v[i] = snapshot[c0 + i];
        kn::rope_lane<D>(v, t, c0, tables, transpose, exchange);
        for (int i = 0; i < kn::kLaneChannels; ++i) rows.row(t)[c0 + i] = v[i];
      }
    }
  };
  rotate_rows(/*transpose=*/false);
  for (int64_t t = 0; t < T; ++t)
    for (int c = 0; c < D; ++c) ASSERT_NEAR(rows.row(t)[c], expected.row(t)[c], 1e-5) << "D " << D << " t " << t << " c " << c;
  rotate_rows(/*transpose=*/true);
  const Matrix original(x);
  for (int64_t t = 0; t < T; ++t)
    for (int c = 0; c < D; ++c) ASSERT_NEAR(rows.row(t)[c], original.row(t)[c], 1e-5) << "D " << D << " t " << t << " c " << c;
}

TEST(RopeMath, LaneSplitRotationMatchesApplyRopeAndItsTransposeUndoesIt) {
  check_lane_split_rope<64>();
  check_lane_split_rope<128>();
}

}  // namespace
