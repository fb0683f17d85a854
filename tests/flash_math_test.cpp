// The __host__ __device__ math of the flash coupled-attention kernels
// (kernels/flash_math.cuh), compiled as plain C++ and driven through the same
// tiling as kernels/fused_attention.cu: the forward's online softmax over key
// tiles and the backward's walk over the query tiles that see a key tile, both
// against causal attention computed naively in float64 (forward values, and
// gradients by autograd). Also the causal tile bounds, the steps a tile needs,
// and RoPE per channel with its transpose.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>
#include <vector>

#include "coupling_math.cuh"
#include "cqk/coupling.h"
#include "cqk/rope.h"
#include "flash_math.cuh"

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

// The forward of fused_attention.cu for one (batch, head): per query tile, the
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

struct Gradients {
  Matrix dq, dk, dv;
};

// The backward of fused_attention.cu: per key tile, the query tiles from the
// first that sees it to the last, p rebuilt from lse2.
Gradients tiled_backward(const Matrix& q, const Matrix& k, const Matrix& v, const Matrix& o, const Matrix& grad_o,
                         const std::vector<float>& lse2, float scale) {
  const int64_t time = q.rows, dim = q.cols;
  Gradients g{Matrix(time, dim), Matrix(time, dim), Matrix(time, v.cols)};
  std::vector<float> delta(static_cast<size_t>(time));
  for (int64_t i = 0; i < time; ++i) delta[static_cast<size_t>(i)] = dot(grad_o.row(i), o.row(i), v.cols);
  const int64_t key_tiles = (time + kn::kFlashKeyTile - 1) / kn::kFlashKeyTile;
  const int64_t query_tiles = (time + kn::kFlashQueryTile - 1) / kn::kFlashQueryTile;
  for (int64_t kt = 0; kt < key_tiles; ++kt) {
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
            g.dq.row(i)[c] += scale * ds * k.row(j)[c];
            g.dk.row(j)[c] += scale * ds * q.row(i)[c];
          }
          for (int64_t c = 0; c < v.cols; ++c) g.dv.row(j)[c] += p * grad_o.row(i)[c];
        }
      }
    }
  }
  return g;
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  const int64_t time = q.size(0);
  const auto mask = at::ones({time, time}, at::kBool).tril();
  const auto scores = at::matmul(q, k.t()).mul(scale).masked_fill(mask.logical_not(), -INFINITY);
  return at::matmul(at::softmax(scores, -1), v);
}

double max_relative_error(const at::Tensor& actual, const at::Tensor& expected) {
  // Floored at 1: where every expected entry is 0 (one visible key: no gradient to q or k), the error is absolute.
  return ((actual - expected).abs().max() / expected.abs().max().clamp_min(1.0)).item<double>();
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

  const auto g = tiled_backward(q, k, v, forward.o, grad_o, forward.lse2, scale);
  EXPECT_LT(max_relative_error(g.dq.tensor(), grads[0]), 1e-4);
  EXPECT_LT(max_relative_error(g.dk.tensor(), grads[1]), 1e-4);
  EXPECT_LT(max_relative_error(g.dv.tensor(), grads[2]), 1e-4);
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

// A key tile runs steps_for_keys(n) steps, a query tile steps_for_queries(n):
// the vector each needs comes out exactly as after all n steps.
TEST(FlashMathCoupling, TilesRunOnlyTheStepsTheirVectorNeeds) {
  constexpr int D = 64, R = 8;
  for (int steps : {1, 2, 3, 4}) {
    cqk::QKCoupling coupling(cqk::CouplingOptions(cqk::CouplingKind::Affine, /*num_heads=*/1, D).hidden(R).steps(steps));
    at::manual_seed(steps);
    {
      at::NoGradGuard no_grad;
      for (auto& p : coupling->parameters()) p.copy_(at::randn_like(p) * 0.15);
    }
    auto params = coupling->named_parameters();
    std::vector<std::vector<float>> storage;
    for (int s = 0; s < steps; ++s)
      for (const char* name : {"w1", "b1", "w2", "b2"})
        storage.push_back(Matrix(params["conditioner" + std::to_string(s) + "." + name][0].reshape({1, -1})).data);
    std::vector<kn::AffineStepWeights> weights;
    for (int s = 0; s < steps; ++s)
      weights.push_back({storage[4 * s].data(), storage[4 * s + 1].data(), storage[4 * s + 2].data(),
                         storage[4 * s + 3].data()});
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
    // As src/fused_attention.cpp's tables: t * base^(-2i/D) in float64, then float.
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

}  // namespace
