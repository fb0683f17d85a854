#pragma once
// The math of the flash-style coupled attention (attention_kernels.cu), shared by
// the CUDA kernels and the CPU test that emulates their tiling
// (tests/flash_math_test.cpp).
//
// Scores live in the log2 domain: the kernels fold softmax_scale * log2(e) into
// the coupled query tile, so a score is s2 = log2(e) * scale * q.k and every
// exponential is an exp2. The saved row statistic is lse2 = log2(sum_j exp2(s2_j)).
//
// Forward of one query row over key tiles (online softmax):
//   m_new = max(m, max_j s2_j);  f = exp2(m - m_new);  p_j = exp2(s2_j - m_new)
//   l <- l f + sum_j p_j;  acc <- acc f + sum_j p_j v_j;  at the end o = acc / l
// Backward (the flash backward, from the inputs and lse2 only):
//   p_ij = exp2(s2_ij - lse2_i),  dp_ij = do_i . v_j,  delta_i = do_i . o_i
//   ds_ij = p_ij (dp_ij - delta_i)           (the gradient of the natural logit)
//   dq_i += scale sum_j ds_ij k_j,  dk_j += scale sum_i ds_ij q_i,  dv_j += sum_i p_ij do_i
#include <cmath>
#include <cstdint>

#include "coupling_math.cuh"  // CQK_HOST_DEVICE

namespace cqk::kernels {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Tile sizes of the kernels (and of the CPU emulation): query rows per block
// and key rows per inner step.
constexpr int kFlashQueryTile = 64;
constexpr int kFlashKeyTile = 64;

// ---------------------------------------------------------------------------
// Causal tiling. Key j is visible from query i when j <= i (and j < time).

CQK_HOST_DEVICE bool causal_visible(int64_t query, int64_t key) { return key <= query; }

// Key tiles query tile `tile` must visit: those holding a key <= its last query.
CQK_HOST_DEVICE int64_t causal_key_tiles(int64_t tile, int64_t time) {
  const int64_t end = (tile + 1) * kFlashQueryTile;
  const int64_t last_query = (end < time ? end : time) - 1;
  return last_query / kFlashKeyTile + 1;
}

// The first query tile that sees any key of key tile `tile`.
CQK_HOST_DEVICE int64_t causal_first_query_tile(int64_t tile) { return tile * kFlashKeyTile / kFlashQueryTile; }

// ---------------------------------------------------------------------------
// Pairs. A launch runs `pairs` (q, k) maps per value head, all reading the
// head's one v: 1 for vanilla attention, 2 for differential attention's two maps.

// The coupling weights pair `pair` of head `head` uses (its group in
// AffineCouplingParams): one coupling per head shared by the pairs (group
// head), one per pair and head (pair-major, group pair * heads + head: the
// differential module's separate couplings over [batch, pairs * heads]), or
// one for everything (group 0).
CQK_HOST_DEVICE int64_t coupling_weight_group(int64_t pair, int64_t head, int64_t heads, bool separate_pairs,
                                              bool shared_across_heads) {
  if (shared_across_heads) return 0;
  return separate_pairs ? pair * heads + head : head;
}

// ---------------------------------------------------------------------------
// The coupling on tiles. Even steps update k, odd steps q, so a key tile needs
// only the steps up to the last even one and a query tile those up to the last
// odd one (later steps do not change that vector).

CQK_HOST_DEVICE int steps_for_keys(int steps) { return steps % 2 == 1 ? steps : steps - 1; }
CQK_HOST_DEVICE int steps_for_queries(int steps) { return steps % 2 == 0 ? steps : steps - 1; }

// ---------------------------------------------------------------------------
// Online softmax of one query row. `max` and `sum` are identical in every
// thread that shares the row (the kernels reduce with xor butterflies).

struct SoftmaxRow {
  float max = -INFINITY;  // running max of the row's s2 so far
  float sum = 0.0f;       // running sum of exp2(s2 - max)
};

// Moves the row to a new tile whose largest visible s2 is tile_max (-inf when
// the tile has none): returns the factor the accumulator must be multiplied by.
CQK_HOST_DEVICE float softmax_rescale(SoftmaxRow& row, float tile_max) {
  const float new_max = fmaxf(row.max, tile_max);
  if (new_max == -INFINITY) return 1.0f;  // nothing visible yet: keep max at -inf, no NaN from -inf - -inf
  const float factor = exp2f(row.max - new_max);  // 0 on the first visible tile
  row.max = new_max;
  row.sum *= factor;
  return factor;
}

// Unnormalised probability of a score after softmax_rescale (0 when masked).
CQK_HOST_DEVICE float softmax_weight(const SoftmaxRow& row, float s2, bool visible) {
  return visible ? exp2f(s2 - row.max) : 0.0f;
}

// Adds a tile's sum of weights (reduced over the row's threads).
CQK_HOST_DEVICE void softmax_accumulate(SoftmaxRow& row, float tile_sum) { row.sum += tile_sum; }

// Factor that turns the accumulator into the output (0 for a row that saw nothing).
CQK_HOST_DEVICE float softmax_normaliser(const SoftmaxRow& row) { return row.sum > 0.0f ? 1.0f / row.sum : 0.0f; }

// log2 of the row's sum of exp2(s2): what the backward needs to rebuild p.
CQK_HOST_DEVICE float softmax_lse2(const SoftmaxRow& row) {
  return row.sum > 0.0f ? row.max + log2f(row.sum) : INFINITY;  // +inf makes every rebuilt p 0
}

// ---------------------------------------------------------------------------
// Backward pieces.

// p_ij rebuilt from the saved row statistic.
CQK_HOST_DEVICE float flash_probability(float s2, float lse2, bool visible) {
  return visible ? exp2f(s2 - lse2) : 0.0f;
}

// ds = p (dp - delta): the softmax backward for one entry.
CQK_HOST_DEVICE float softmax_logit_grad(float p, float dp, float delta) { return p * (dp - delta); }

// delta_i = do_i . o_i over n channels (the kernels sum lane parts of it).
template <int N>
CQK_HOST_DEVICE float row_dot(const float (&a)[N], const float (&b)[N]) {
  float sum = 0.0f;
  CQK_UNROLL
  for (int c = 0; c < N; ++c) sum += a[c] * b[c];
  return sum;
}

}  // namespace cqk::kernels
