// Flash-style coupled attention, causal: forward and backward. The math is
// flash_math.cuh (online softmax, backward pieces) and coupling_math.cuh (the
// coupling per lane), both also compiled and tested on the CPU; this file is
// the tiling and the CUDA plumbing.
//
// A block of 256 threads owns one (batch, head) and one tile of 64 rows (the
// forward one pair of it, the backward every pair: below). Tiles
// of q or k are coupled as they are loaded: a token's D channels over L = D/8
// lanes, as in coupling_kernels.cu, every step in registers with the head's
// weights packed in shared memory (read from global memory instead in the
// backward at head dim 128 with values of 256), then RoPE (the partner
// channel is in lane l ^ L/2: one shuffle), then the tile goes to shared
// memory in float32. Only
// the steps that change the needed vector run (steps_for_keys/_queries).
// Scores, probabilities and products are SIMT float32: thread (ty, tx) =
// (tid / 16, tid % 16) owns rows 4ty..4ty+3 and columns tx + 16c of each
// 64 x 64 score tile and of each 64 x D (or 64 x DV) accumulator; a row's 16 threads share
// one half-warp and reduce with xor butterflies (identical bits in each).
//
// D is the head dim of q and k, DV that of v and o (2D in differential attention).
//
// Forward: grid (query tiles, batch * pairs * heads), longest rows first; per
// key tile up to the diagonal: couple K, load V, S = Q K^T, online softmax,
// O += P V.
// Backward: grid (key tiles, batch * heads); the block walks the pairs, and per
// pair the query tiles that see its key tile, with dK (per pair) and dV (summed
// over the pairs) in registers; dQ goes to a float32 buffer with atomicAdd. RoPE's transpose is applied in registers (a
// column's partner column is owned by the same thread), so the outputs are
// gradients with respect to the coupling's outputs.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "coupling_device.cuh"
#include "flash_math.cuh"
#include "attention_kernels.h"

namespace cqk::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kRowThreads = 16;                               // threads sharing a score row
constexpr int kRowsPerThread = kFlashQueryTile / kRowThreads;  // 4
static_assert(kFlashQueryTile == kFlashKeyTile && kFlashQueryTile == (kThreads / kRowThreads) * kRowsPerThread,
              "the thread grid covers one 64 x 64 tile");
constexpr int kTile = kFlashQueryTile;
constexpr int kScoreStride = kTile + 1;  // padded rows of the score tiles: no bank conflicts down a column

// Padded rows of the [64][D] tiles.
template <int D>
__host__ __device__ constexpr int row_stride() {
  return D + 1;
}

struct FlashGeometry {
  int64_t batch, pairs, heads, time;
  // First row of (b, p, h) in the contiguous [batch, pairs, heads, time] layouts (o, lse2, delta, dq, dk).
  __device__ int64_t first_row(int64_t b, int64_t p, int64_t h) const { return ((b * pairs + p) * heads + h) * time; }
};

__device__ __forceinline__ int64_t head_offset(const PairedRowStrides& s, int64_t b, int64_t p, int64_t h) {
  return b * s.batch + p * s.pair + h * s.head;
}
__device__ __forceinline__ int64_t head_offset(const RowStrides& s, int64_t b, int64_t h) {
  return b * s.batch + h * s.head;
}

__device__ __forceinline__ void store1(float* p, float v) { *p = v; }
__device__ __forceinline__ void store1(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// Sum / max over the 16 threads of a score row (one half-warp).
__device__ __forceinline__ float row_sum(float v) {
#pragma unroll
  for (int offset = kRowThreads / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float row_max(float v) {
#pragma unroll
  for (int offset = kRowThreads / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Couples tokens t0 .. t0+63 of pair p of head (b, h) and writes q''
// (Queries) or k'' times `scale` into tile[64][D+1]. Rows past the end are
// zero. Every thread of the block calls it (the lanes shuffle).
template <int D, int R, class T, bool Queries, class Views>
__device__ void load_coupled_tile(const CoupledAttentionInputs& in, const FlashGeometry& g, const Views& views,
                                  int64_t b, int64_t p, int64_t h, int64_t t0, float scale, float* tile) {
  constexpr int L = D / kLaneChannels, G = kThreads / L;
  const int lane = threadIdx.x % L, slot = threadIdx.x / L, c0 = lane * kLaneChannels;
  const T* q = static_cast<const T*>(in.q) + head_offset(in.q_strides, b, p, h);
  const T* k = static_cast<const T*>(in.k) + head_offset(in.k_strides, b, p, h);
  const int steps = Queries ? steps_for_queries(in.coupling.num_steps) : steps_for_keys(in.coupling.num_steps);
  for (int r0 = 0; r0 < kTile; r0 += G) {
    const int row = r0 + slot;
    const int64_t t = t0 + row;
    const bool valid = t < g.time;
    const int64_t tc = valid ? t : g.time - 1;  // whole lane groups keep shuffling
    float qv[kLaneChannels], kv[kLaneChannels];
    load8(q + tc * in.q_strides.time + c0, qv);
    load8(k + tc * in.k_strides.time + c0, kv);
    lane_coupling_forward<R, kLaneChannels>(views, steps, in.coupling.clamp, c0, qv, kv, ShuffleReduce<L>{});
    float(&x)[kLaneChannels] = *(Queries ? &qv : &kv);
    if (in.rope.cos) rope_lane<D>(x, tc, c0, in.rope, /*transpose=*/false, ShuffleExchange<L>{});
#pragma unroll
    for (int i = 0; i < kLaneChannels; ++i) tile[row * row_stride<D>() + c0 + i] = valid ? x[i] * scale : 0.0f;
  }
}

// Rows t0 .. t0+63 of one head's [time, D] rows (row t at x + t * time_stride)
// into tile[64][D+1]; rows past the end are zero.
template <int D, class T>
__device__ void load_tile(const T* x, int64_t time_stride, const FlashGeometry& g, int64_t t0, float* tile) {
  constexpr int L = D / kLaneChannels;
  for (int item = threadIdx.x; item < kTile * L; item += kThreads) {
    const int row = item / L, c0 = (item % L) * kLaneChannels;
    const int64_t t = t0 + row;
    float v[kLaneChannels] = {};
    if (t < g.time) load8(x + t * time_stride + c0, v);
#pragma unroll
    for (int i = 0; i < kLaneChannels; ++i) tile[row * row_stride<D>() + c0 + i] = v[i];
  }
}

// a[r][c] = sum_d A[4ty + r][d] B[tx + 16c][d] over two [64][D+1] tiles.
template <int D>
__device__ __forceinline__ void tile_dot(const float* a, const float* b, float (&out)[kRowsPerThread][4]) {
  const int ty = threadIdx.x / kRowThreads, tx = threadIdx.x % kRowThreads;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) out[r][c] = 0.0f;
#pragma unroll 4
  for (int d = 0; d < D; ++d) {
    float av[kRowsPerThread], bv[4];
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) av[r] = a[(ty * kRowsPerThread + r) * row_stride<D>() + d];
#pragma unroll
    for (int c = 0; c < 4; ++c) bv[c] = b[(tx + kRowThreads * c) * row_stride<D>() + d];
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) out[r][c] += av[r] * bv[c];
  }
}

// Floats of the packed weights, rounded up to a multiple of 4 (16 bytes).
__host__ __device__ constexpr int64_t weight_floats(int64_t d, int64_t r, int64_t steps) {
  return (steps * (3 * d * r + r + 2 * d) + 3) / 4 * 4;
}

// Whether the backward keeps the coupling's weights in shared memory. Not at
// head dim 128 with values of 256 (differential attention): its tiles alone
// take 231,424 of the 232,448 bytes a block gets on sm_90, so its lanes read
// the weights from global memory. The forward always packs them.
__host__ __device__ constexpr bool backward_weights_in_shared(int64_t dv) { return dv <= 128; }

// The weights pair p of head h uses: packed into shared memory (the caller
// synchronises before reading them), or read from global memory.
template <int D, int R, bool Packed>
__device__ auto pair_weight_views(float* smem, const CoupledAttentionInputs& in, int64_t p, int64_t h) {
  const int64_t group =
      coupling_weight_group(p, h, in.shape.heads, in.separate_pair_couplings, in.coupling.shared_across_heads);
  if constexpr (Packed) {
    pack_weights<D, R>(smem, in.coupling, group);
    return SmemViews<D, R>{smem};
  } else {
    return GlobalViews<D, R>{&in.coupling, group};
  }
}

// ---------------------------------------------------------------------------
// Forward.

template <int D, int DV, int R, class T>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(CoupledAttentionInputs in, FlashGeometry g, T* __restrict__ o, float* __restrict__ lse2) {
  constexpr int S = row_stride<D>(), SV = row_stride<DV>(), CV = DV / kRowThreads;
  CQK_DYNAMIC_SHARED(smem);
  float* qt = smem + weight_floats(D, R, in.coupling.num_steps);
  float* kt = qt + kTile * S;
  float* vt = kt + kTile * S;
  float* pt = vt + kTile * SV;
  // blockIdx.y = (b * pairs + pair) * heads + h: o's and lse2's (b, pair, h) order.
  const int64_t h = blockIdx.y % g.heads, pair = blockIdx.y / g.heads % g.pairs,
                b = blockIdx.y / (g.heads * g.pairs);
  const int64_t tile = gridDim.x - 1 - blockIdx.x;  // the longest rows start first
  const T* v = static_cast<const T*>(in.v) + head_offset(in.v_strides, b, h);
  const auto views = pair_weight_views<D, R, /*Packed=*/true>(smem, in, pair, h);
  __syncthreads();
  load_coupled_tile<D, R, T, true>(in, g, views, b, pair, h, tile * kTile, in.softmax_scale * kLog2e, qt);

  const int ty = threadIdx.x / kRowThreads, tx = threadIdx.x % kRowThreads;
  float acc[kRowsPerThread][CV] = {};
  SoftmaxRow rows[kRowsPerThread];
  const int64_t key_tiles = causal_key_tiles(tile, g.time);
  for (int64_t j = 0; j < key_tiles; ++j) {
    __syncthreads();  // the previous tile's readers are done with kt, vt, pt
    load_coupled_tile<D, R, T, false>(in, g, views, b, pair, h, j * kTile, 1.0f, kt);
    load_tile<DV>(v, in.v_strides.time, g, j * kTile, vt);
    __syncthreads();
    float s[kRowsPerThread][4];
    tile_dot<D>(qt, kt, s);
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int64_t query = tile * kTile + ty * kRowsPerThread + r;
      bool visible[4];
      float tile_max = -INFINITY;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t key = j * kTile + tx + kRowThreads * c;
        visible[c] = causal_visible(query, key) && key < g.time;
        if (visible[c]) tile_max = fmaxf(tile_max, s[r][c]);
      }
      const float factor = softmax_rescale(rows[r], row_max(tile_max));
      float tile_sum = 0.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float p = softmax_weight(rows[r], s[r][c], visible[c]);
        tile_sum += p;
        pt[(ty * kRowsPerThread + r) * kScoreStride + tx + kRowThreads * c] = p;
      }
      softmax_accumulate(rows[r], row_sum(tile_sum));
#pragma unroll
      for (int c = 0; c < CV; ++c) acc[r][c] *= factor;
    }
    __syncthreads();
#pragma unroll 4
    for (int key = 0; key < kTile; ++key) {
      float vv[CV];
#pragma unroll
      for (int c = 0; c < CV; ++c) vv[c] = vt[key * SV + tx + kRowThreads * c];
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        const float w = pt[(ty * kRowsPerThread + r) * kScoreStride + key];
#pragma unroll
        for (int c = 0; c < CV; ++c) acc[r][c] += w * vv[c];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int64_t query = tile * kTile + ty * kRowsPerThread + r;
    if (query >= g.time) continue;
    const int64_t row = blockIdx.y * g.time + query;
    const float norm = softmax_normaliser(rows[r]);
#pragma unroll
    for (int c = 0; c < CV; ++c) store1(o + row * DV + tx + kRowThreads * c, acc[r][c] * norm);
    if (tx == 0) lse2[row] = softmax_lse2(rows[r]);
  }
}

// ---------------------------------------------------------------------------
// Backward.

// delta[row] = grad_o[row] . o[row] over DV channels, L lanes per row.
template <int DV, class T>
__global__ void __launch_bounds__(kThreads)
    flash_delta_kernel(const T* __restrict__ o, const T* __restrict__ grad_o, PairedRowStrides gos, FlashGeometry g,
                       float* __restrict__ delta) {
  constexpr int L = DV / kLaneChannels;
  const int64_t rows = g.batch * g.pairs * g.heads * g.time;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / L;
  const int c0 = (threadIdx.x % L) * kLaneChannels;
  const int64_t rc = row < rows ? row : rows - 1;  // whole lane groups keep shuffling
  const int64_t t = rc % g.time, h = rc / g.time % g.heads, p = rc / (g.time * g.heads) % g.pairs,
                b = rc / (g.time * g.heads * g.pairs);
  float ov[kLaneChannels], gv[kLaneChannels];
  load8(o + rc * DV + c0, ov);
  load8(grad_o + head_offset(gos, b, p, h) + t * gos.time + c0, gv);
  float part[1] = {row_dot(ov, gv)};
  ShuffleReduce<L>{}(part);
  if (row < rows && c0 == 0) delta[row] = part[0];
}

// RoPE transpose of a thread's accumulator row: column tx + 16c pairs with
// column tx + 16 (c ^ C/2), held by the same thread.
template <int D>
__device__ __forceinline__ void rope_transpose_row(float (&x)[D / kRowThreads], int64_t t, const RopeTables& rope) {
  constexpr int C = D / kRowThreads, Half = D / 2;
  const int tx = threadIdx.x % kRowThreads;
  float out[C];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const bool upper = c >= C / 2;
    const int64_t f = t * Half + tx + kRowThreads * (c % (C / 2));
    out[c] = rope_channel(x[c], x[c ^ (C / 2)], rope.cos[f], -rope.sin[f], upper);
  }
#pragma unroll
  for (int c = 0; c < C; ++c) x[c] = out[c];
}

// One block owns a key tile for every pair: the block walks the pairs one after
// the other, so the pairs' contributions to the shared dV rows add up in its
// registers. Both pairs write the same dv rows; a block per (pair, key tile)
// would need atomics into a float32 scratch buffer (and a cast pass, and
// run-to-run rounding differences), while this way dv is written once, plainly,
// and the V tile is loaded once for both pairs.
template <int D, int DV, int R, class T>
__global__ void __launch_bounds__(kThreads)
    flash_backward_kernel(CoupledAttentionInputs in, FlashGeometry g, const T* __restrict__ grad_o,
                          PairedRowStrides gos, const float* __restrict__ lse2, const float* __restrict__ delta,
                          float* __restrict__ dq, float* __restrict__ dk, T* __restrict__ dv) {
  constexpr int S = row_stride<D>(), SV = row_stride<DV>(), C = D / kRowThreads, CV = DV / kRowThreads;
  constexpr bool kPacked = backward_weights_in_shared(DV);
  CQK_DYNAMIC_SHARED(smem);
  float* qt = smem + (kPacked ? weight_floats(D, R, in.coupling.num_steps) : 0);
  float* kt = qt + kTile * S;
  float* vt = kt + kTile * S;
  float* got = vt + kTile * SV;
  float* pt = got + kTile * SV;
  float* dst = pt + kTile * kScoreStride;
  float* lse_s = dst + kTile * kScoreStride;
  float* delta_s = lse_s + kTile;
  const int64_t b = blockIdx.y / g.heads, h = blockIdx.y % g.heads;
  const int64_t tile = blockIdx.x;  // key tile; the first ones see the most queries and start first
  load_tile<DV>(static_cast<const T*>(in.v) + head_offset(in.v_strides, b, h), in.v_strides.time, g, tile * kTile, vt);

  const int ty = threadIdx.x / kRowThreads, tx = threadIdx.x % kRowThreads;
  float dv_acc[kRowsPerThread][CV] = {};
  const int64_t query_tiles = (g.time + kTile - 1) / kTile;
  for (int64_t pair = 0; pair < g.pairs; ++pair) {
    const int64_t first_row = g.first_row(b, pair, h);
    const T* grad_o_head = grad_o + head_offset(gos, b, pair, h);
    __syncthreads();  // the previous pair's readers are done with the weights and kt
    const auto views = pair_weight_views<D, R, kPacked>(smem, in, pair, h);
    if constexpr (kPacked) __syncthreads();  // the packed weights are complete
    load_coupled_tile<D, R, T, false>(in, g, views, b, pair, h, tile * kTile, 1.0f, kt);
    float dk_acc[kRowsPerThread][C] = {};
    for (int64_t i = causal_first_query_tile(tile); i < query_tiles; ++i) {
      __syncthreads();  // the previous tile's readers are done
      load_coupled_tile<D, R, T, true>(in, g, views, b, pair, h, i * kTile, in.softmax_scale * kLog2e, qt);
      load_tile<DV>(grad_o_head, gos.time, g, i * kTile, got);
      if (threadIdx.x < kTile) {
        const int64_t query = i * kTile + threadIdx.x;
        const bool valid = query < g.time;
        lse_s[threadIdx.x] = valid ? lse2[first_row + query] : INFINITY;
        delta_s[threadIdx.x] = valid ? delta[first_row + query] : 0.0f;
      }
      __syncthreads();
      // Rows: queries 4ty + r; columns: keys tx + 16c.
      float s[kRowsPerThread][4], dp[kRowsPerThread][4];
      tile_dot<D>(qt, kt, s);
      tile_dot<DV>(got, vt, dp);
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        const int row = ty * kRowsPerThread + r;
        const int64_t query = i * kTile + row;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int64_t key = tile * kTile + tx + kRowThreads * c;
          const bool visible = causal_visible(query, key) && key < g.time && query < g.time;
          const float p = flash_probability(s[r][c], lse_s[row], visible);
          pt[row * kScoreStride + tx + kRowThreads * c] = p;
          dst[row * kScoreStride + tx + kRowThreads * c] = softmax_logit_grad(p, dp[r][c], delta_s[row]);
        }
      }
      __syncthreads();
      // dV and dK: rows are keys 4ty + r, columns channels tx + 16c.
#pragma unroll 2
      for (int qr = 0; qr < kTile; ++qr) {
        float gov[CV], qv[C];
#pragma unroll
        for (int c = 0; c < CV; ++c) gov[c] = got[qr * SV + tx + kRowThreads * c];
#pragma unroll
        for (int c = 0; c < C; ++c) qv[c] = qt[qr * S + tx + kRowThreads * c];
#pragma unroll
        for (int r = 0; r < kRowsPerThread; ++r) {
          const float p = pt[qr * kScoreStride + ty * kRowsPerThread + r];
          const float ds = dst[qr * kScoreStride + ty * kRowsPerThread + r];
#pragma unroll
          for (int c = 0; c < CV; ++c) dv_acc[r][c] += p * gov[c];
#pragma unroll
          for (int c = 0; c < C; ++c) dk_acc[r][c] += ds * qv[c];
        }
      }
      // dQ of this pair of tiles: rows are queries 4ty + r.
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        const int row = ty * kRowsPerThread + r;
        const int64_t query = i * kTile + row;
        float part[C] = {};
#pragma unroll 4
        for (int key = 0; key < kTile; ++key) {
          const float ds = dst[row * kScoreStride + key];
#pragma unroll
          for (int c = 0; c < C; ++c) part[c] += ds * kt[key * S + tx + kRowThreads * c];
        }
        if (query >= g.time) continue;
#pragma unroll
        for (int c = 0; c < C; ++c) part[c] *= in.softmax_scale;
        if (in.rope.cos) rope_transpose_row<D>(part, query, in.rope);
        float* out = dq + (first_row + query) * D + tx;
#pragma unroll
        for (int c = 0; c < C; ++c) atomicAdd(out + kRowThreads * c, part[c]);
      }
    }
    // qt held q'' * scale * log2(e): dk = scale * sum ds q'' = ln(2) * sum ds qt.
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int64_t key = tile * kTile + ty * kRowsPerThread + r;
      if (key >= g.time) continue;
#pragma unroll
      for (int c = 0; c < C; ++c) dk_acc[r][c] *= kLn2;
      if (in.rope.cos) rope_transpose_row<D>(dk_acc[r], key, in.rope);
#pragma unroll
      for (int c = 0; c < C; ++c) dk[(first_row + key) * D + tx + kRowThreads * c] = dk_acc[r][c];
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int64_t key = tile * kTile + ty * kRowsPerThread + r;
    if (key >= g.time) continue;
    T* out = dv + ((b * g.heads + h) * g.time + key) * DV + tx;
#pragma unroll
    for (int c = 0; c < CV; ++c) store1(out + kRowThreads * c, dv_acc[r][c]);
  }
}

// ---------------------------------------------------------------------------
// Host side.

int64_t forward_smem_floats(int64_t d, int64_t dv, int64_t r, int64_t steps) {
  return weight_floats(d, r, steps) + 2 * kTile * (d + 1) + kTile * (dv + 1) + kTile * kScoreStride;
}

int64_t backward_smem_floats(int64_t d, int64_t dv, int64_t r, int64_t steps) {
  return (backward_weights_in_shared(dv) ? weight_floats(d, r, steps) : 0) + 2 * kTile * (d + 1) +
         2 * kTile * (dv + 1) + 2 * kTile * kScoreStride + 2 * kTile;
}

constexpr const char* kWho = "coupled attention";

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string(kWho) + ": " + what);
}

std::string shape_text(const CoupledAttentionInputs& in) {
  return "head_dim " + std::to_string(in.shape.head_dim) + ", value_dim " + std::to_string(in.shape.value_dim) +
         ", hidden " + std::to_string(in.shape.hidden) + ", steps " + std::to_string(in.coupling.num_steps);
}

// Every (batch, head) and every (pair, head) starts its rows on 16-byte boundaries.
bool rows_aligned(const void* data, const PairedRowStrides& s, ElementType type) {
  return fused_coupling_rows_aligned(data, {s.batch, s.head, s.time}, type) &&
         fused_coupling_rows_aligned(data, {s.pair, s.head, s.time}, type);
}

// Checks what both passes read; returns the device's limits.
DeviceInfo validate(ElementType type, const CoupledAttentionInputs& in) {
  const AttentionShape& s = in.shape;
  require(coupled_attention_shape_supported(s.head_dim, s.value_dim, s.hidden, in.coupling.num_steps),
          "unsupported head_dim " + std::to_string(s.head_dim) + " / value_dim " + std::to_string(s.value_dim) +
              " / hidden " + std::to_string(s.hidden) + " / steps " + std::to_string(in.coupling.num_steps) +
              " (compiled: 64 or 128 / head_dim or twice it; 8 or 16; 1..8)");
  require(s.batch >= 0 && s.pairs >= 1 && s.heads >= 1 && s.time >= 0, "bad batch/pairs/heads/time");
  require(s.batch * s.pairs * s.heads <= 65535, "batch * pairs * heads must be at most 65535 (grid y)");
  for (int i = 0; i < in.coupling.num_steps; ++i)
    require(in.coupling.w1[i] && in.coupling.b1[i] && in.coupling.w2[i] && in.coupling.b2[i],
            "missing weights of step " + std::to_string(i));
  require(rows_aligned(in.q, in.q_strides, type) && rows_aligned(in.k, in.k_strides, type) &&
              fused_coupling_rows_aligned(in.v, in.v_strides, type),
          "rows of q, k and v must start on 16-byte boundaries");
  require((in.rope.cos == nullptr) == (in.rope.sin == nullptr), "RoPE needs both tables");
  DeviceInfo info;
  if (!query_device(info)) throw std::runtime_error("coupled attention: no CUDA device");
  return info;
}

FlashGeometry geometry(const AttentionShape& s) { return {s.batch, s.pairs, s.heads, s.time}; }

dim3 tile_grid(const AttentionShape& s, int64_t heads_of_grid) {
  return dim3(static_cast<unsigned>((s.time + kTile - 1) / kTile), static_cast<unsigned>(s.batch * heads_of_grid));
}

// Calls f(integral_constant<D>, integral_constant<DV>, integral_constant<R>,
// TypeTag<T>) for the compiled shape (validate() has checked it).
template <class F>
void dispatch_attention_shape(const AttentionShape& s, ElementType type, F&& f) {
  const CouplingShape coupling{s.batch, s.heads, s.time, s.head_dim, s.hidden};
  dispatch_compiled_shape(coupling, type, "coupled attention", [&](auto d, auto r, auto tag) {
    constexpr int D = decltype(d)::value;
    if (s.value_dim == 2 * D) return f(d, std::integral_constant<int, 2 * D>{}, r, tag);
    f(d, d, r, tag);
  });
}

}  // namespace

bool coupled_attention_shape_supported(int64_t head_dim, int64_t value_dim, int64_t hidden, int64_t steps) {
  const bool dims = (head_dim == 64 || head_dim == 128) && (value_dim == head_dim || value_dim == 2 * head_dim);
  return dims && (hidden == 8 || hidden == 16) && steps >= 1 && steps <= AffineCouplingParams::kMaxSteps;
}

int64_t coupled_attention_smem_bytes(int64_t head_dim, int64_t value_dim, int64_t hidden, int64_t steps) {
  return std::max(forward_smem_floats(head_dim, value_dim, hidden, steps),
                  backward_smem_floats(head_dim, value_dim, hidden, steps)) *
         static_cast<int64_t>(sizeof(float));
}

bool coupled_attention_supported(int64_t head_dim, int64_t value_dim, int64_t hidden, int64_t steps) {
  if (!coupled_attention_shape_supported(head_dim, value_dim, hidden, steps)) return false;
  DeviceInfo info;
  return query_device(info) && coupled_attention_smem_bytes(head_dim, value_dim, hidden, steps) <= info.smem_optin;
}

void coupled_attention_forward_cuda(ElementType type, const CoupledAttentionInputs& in, void* o, float* lse2,
                                    void* stream) {
  const DeviceInfo info = validate(type, in);
  const AttentionShape& s = in.shape;
  if (s.batch * s.heads * s.time == 0) return;
  require(o && lse2, "missing outputs");
  const int64_t smem = forward_smem_floats(s.head_dim, s.value_dim, s.hidden, in.coupling.num_steps) * 4;
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_attention_shape(s, type, [&](auto d, auto dv, auto r, auto tag) {
    constexpr int D = decltype(d)::value, DV = decltype(dv)::value, R = decltype(r)::value;
    using T = typename decltype(tag)::type;
    auto kernel = flash_forward_kernel<D, DV, R, T>;
    allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem, info, kWho, shape_text(in));
    CQK_LAUNCH(kernel, tile_grid(s, s.pairs * s.heads), kThreads, smem, st)(in, geometry(s), static_cast<T*>(o),
                                                                            lse2);
  });
  check_cuda(cudaGetLastError(), kWho, "forward launch");
}

void coupled_attention_backward_cuda(ElementType type, const CoupledAttentionInputs& in, const void* o,
                                     const void* grad_o, const PairedRowStrides& grad_o_strides, const float* lse2,
                                     float* delta, float* dq_coupled, float* dk_coupled, void* dv, void* stream) {
  const DeviceInfo info = validate(type, in);
  const AttentionShape& s = in.shape;
  if (s.batch * s.heads * s.time == 0) return;
  require(o && grad_o && lse2 && delta && dq_coupled && dk_coupled && dv, "missing buffers");
  require(fused_coupling_rows_aligned(o, {0, 0, s.value_dim}, type) && rows_aligned(grad_o, grad_o_strides, type),
          "rows of o and grad_o must start on 16-byte boundaries");
  const int64_t smem = backward_smem_floats(s.head_dim, s.value_dim, s.hidden, in.coupling.num_steps) * 4;
  const int64_t rows = s.batch * s.pairs * s.heads * s.time;
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_attention_shape(s, type, [&](auto d, auto dvd, auto r, auto tag) {
    constexpr int D = decltype(d)::value, DV = decltype(dvd)::value, R = decltype(r)::value;
    using T = typename decltype(tag)::type;
    const int64_t rows_per_block = kThreads / (DV / kLaneChannels);
    const auto delta_kernel = flash_delta_kernel<DV, T>;
    const dim3 delta_grid(static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block));
    CQK_LAUNCH(delta_kernel, delta_grid, kThreads, 0, st)(static_cast<const T*>(o), static_cast<const T*>(grad_o),
                                                          grad_o_strides, geometry(s), delta);
    auto kernel = flash_backward_kernel<D, DV, R, T>;
    allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem, info, kWho, shape_text(in));
    // One block per (batch, head, key tile) for all pairs: see flash_backward_kernel.
    CQK_LAUNCH(kernel, tile_grid(s, s.heads), kThreads, smem, st)(in, geometry(s), static_cast<const T*>(grad_o),
                                                                  grad_o_strides, lse2, delta, dq_coupled,
                                                                  dk_coupled, static_cast<T*>(dv));
  });
  check_cuda(cudaGetLastError(), kWho, "backward launch");
}

}  // namespace cqk::kernels
