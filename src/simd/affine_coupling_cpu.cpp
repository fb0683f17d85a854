// The kernels, compiled once per instruction set (src/simd/CMakeLists.txt:
// -O3 -ffast-math -fopenmp and the set's flags), each copy in the namespace
// cqk::cpu::CQK_SIMD_VARIANT; simd_dispatch.cpp picks one at run time. This
// unit includes no torch or standard-library templates whose vector copies the
// linker could pick for code that runs on any x86-64 (the one-definition rule).
//
// Layout: a thread runs a chunk of kChunk consecutive tokens of one (batch,
// head) row side by side, one token per vector lane (kSlices vectors per
// chunk). Each of the chunk's q, k, gradients and conditioner values is
// stored channel-major ([channel][kChunk]), so a product with a weight is a
// broadcast times a vector, no sum crosses lanes, and the exp/tanh loops run
// on full vectors (glibc's libmvec). The per-token layout it replaced spent
// its time in half-width products over the hidden units and in sums across
// lanes (docs/KERNELS.md).
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "simd_variants.h"

namespace cqk::cpu::CQK_SIMD_VARIANT {

namespace {

// One vector of the set: the tokens of one slice of a chunk, one per lane.
// A scalar operand is broadcast. (A wider generic vector type would be kept
// in memory by GCC, not in registers.)
#ifdef __AVX512F__
constexpr int kSlice = 16;
#else
constexpr int kSlice = 8;
#endif
typedef float Vector __attribute__((vector_size(kSlice * sizeof(float))));

// Tokens per chunk: kSlices vectors. The weight-gradient sums add a chunk's
// slices together before each read-modify-write of the per-lane sums, whose
// traffic (they do not fit in L1) took 40% of the backward at one slice per chunk.
constexpr int kSlices = 4;
constexpr int kChunk = kSlices * kSlice;

inline Vector load(const float* p) {
  Vector v;
  memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, Vector v) { memcpy(p, &v, sizeof v); }
inline void add_to(float* p, Vector v) { store(p, load(p) + v); }

// Sum over a chunk's slices of the lane-wise product of two [kChunk] rows.
inline Vector slice_dot(const float* a, const float* b) {
  Vector sum = load(a) * load(b);
#pragma GCC unroll 4
  for (int v = kSlice; v < kChunk; v += kSlice) sum += load(a + v) * load(b + v);
  return sum;
}
inline Vector slice_sum(const float* a) {
  Vector sum = load(a);
#pragma GCC unroll 4
  for (int v = kSlice; v < kChunk; v += kSlice) sum += load(a + v);
  return sum;
}

// Rows handled together in the products: their accumulators share each load
// of the other operand and are independent chains of adds (AVX2 has 16 vector
// registers, AVX-512 32).
#ifdef __AVX512F__
constexpr int kUnitBlock = 8;
#else
constexpr int kUnitBlock = 4;
#endif

// The shape with what the parameters add to it, derived once per call.
struct Problem {
  int64_t batch, heads, time, head_dim, hidden, steps;
  int64_t groups;  // weight sets per step: heads, or 1 when shared across heads
  float clamp;
  int64_t chunks_per_row;  // chunks per (batch, head) row of `time` tokens
};

Problem problem_of(const kernels::CouplingShape& s, const kernels::AffineCouplingParams& p) {
  return {s.batch,
          s.heads,
          s.time,
          s.head_dim,
          s.hidden,
          p.num_steps,
          p.shared_across_heads ? 1 : s.heads,
          p.clamp,
          (s.time + kChunk - 1) / kChunk};
}

// Work items in head-major order, so that a thread's contiguous share of them
// changes weight group rarely (each change flushes its gradient sums).
struct Chunk {
  int64_t batch, head, first_token, tokens;  // tokens <= kChunk
};

Chunk chunk_at(const Problem& s, int64_t item) {
  const int64_t head = item / (s.batch * s.chunks_per_row);
  const int64_t batch = (item / s.chunks_per_row) % s.batch;
  const int64_t first = (item % s.chunks_per_row) * kChunk;
  const int64_t tokens = s.time - first < kChunk ? s.time - first : kChunk;
  return {batch, head, first, tokens};
}

int64_t group_of(const Problem& s, const Chunk& c) { return s.groups == 1 ? 0 : c.head; }

// A zero-filled float buffer aligned to a cache line.
class Buffer {
 public:
  explicit Buffer(int64_t floats) {
    const size_t bytes = (static_cast<size_t>(floats) * sizeof(float) + 63) / 64 * 64;
    data_ = static_cast<float*>(aligned_alloc(64, bytes));
    memset(data_, 0, bytes);
  }
  ~Buffer() { free(data_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* get() const { return data_; }

 private:
  float* data_ = nullptr;
};

// A thread's chunk vectors, channel-major: row c of a [rows][kChunk] block
// holds channel c of every token of the chunk.
struct ChunkScratch {
  explicit ChunkScratch(const Problem& s) : buffer((8 * s.head_dim + 4 * s.hidden) * kChunk) {
    const int64_t vector = s.head_dim * kChunk, pair = 2 * vector, hidden = s.hidden * kChunk;
    q = buffer.get();
    k = q + vector;
    grad_q = k + vector;
    grad_k = grad_q + vector;
    o = grad_k + vector;
    grad_o = o + pair;
    a = grad_o + pair;
    sig = a + hidden;
    h = sig + hidden;
    grad_a = h + hidden;
  }

  Buffer buffer;
  float *q, *k, *grad_q, *grad_k;  // [D][kChunk]
  float *o, *grad_o;               // [2D][kChunk]: the s_raw rows, then the t rows
  float *a, *sig, *h, *grad_a;     // [R][kChunk]: conditioner pre-activation, sigmoid(a), silu(a)
};

// 8 x 8 transpose of floats in AVX registers (both compiled sets have AVX).
inline void transpose8(__m256 (&r)[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// `tokens` rows of a [rows, D] matrix whose rows are `stride` floats apart,
// into a channel-major block, 8 x 8 tiles at a time (D is a multiple of 8).
// Lanes past `tokens` repeat the last token: finite values the caller ignores
// (or zeroes, in gradients).
void load_chunk(const float* rows, int64_t stride, int64_t tokens, int64_t D, float* block) {
  for (int t0 = 0; t0 < kChunk; t0 += 8) {
    const float* row[8];
    for (int j = 0; j < 8; ++j) row[j] = rows + (t0 + j < tokens ? t0 + j : tokens - 1) * stride;
    for (int64_t c0 = 0; c0 < D; c0 += 8) {
      __m256 tile[8];
      for (int j = 0; j < 8; ++j) tile[j] = _mm256_loadu_ps(row[j] + c0);
      transpose8(tile);
      for (int j = 0; j < 8; ++j) _mm256_storeu_ps(block + (c0 + j) * kChunk + t0, tile[j]);
    }
  }
}

// The first `tokens` lanes of a channel-major block back into contiguous rows of D.
void store_chunk(const float* block, int64_t tokens, int64_t D, float* rows) {
  for (int t0 = 0; t0 < tokens; t0 += 8) {
    for (int64_t c0 = 0; c0 < D; c0 += 8) {
      __m256 tile[8];
      for (int j = 0; j < 8; ++j) tile[j] = _mm256_loadu_ps(block + (c0 + j) * kChunk + t0);
      transpose8(tile);
      for (int j = 0; j < 8 && t0 + j < tokens; ++j) _mm256_storeu_ps(rows + (t0 + j) * D + c0, tile[j]);
    }
  }
}

void zero_lanes_past(int64_t tokens, int64_t rows, float* block) {
  for (int64_t c = 0; c < rows; ++c)
    for (int64_t t = tokens; t < kChunk; ++t) block[c * kChunk + t] = 0.0f;
}

// RoPE's cos and sin per channel pair c < D/2 and token position, channel-major
// and padded to whole chunks ([D/2][chunks_per_row * kChunk], zero past the
// row), from the launchers' [time][D/2] tables: a chunk's positions for one
// pair are then a vector load, as its channels are.
class ChunkRopeTables {
 public:
  ChunkRopeTables(const Problem& s, const kernels::RopeTables& rope)
      : on_(rope.cos != nullptr),
        half_(s.head_dim / 2),
        stride_(s.chunks_per_row * kChunk),
        buffer_(on_ ? 2 * half_ * stride_ : 1) {
    if (!on_) return;
    float* cos = buffer_.get();
    float* sin = cos + half_ * stride_;
    for (int64_t t = 0; t < s.time; ++t)
      for (int64_t c = 0; c < half_; ++c) {
        cos[c * stride_ + t] = rope.cos[t * half_ + c];
        sin[c * stride_ + t] = rope.sin[t * half_ + c];
      }
  }
  bool on() const { return on_; }

  // Rotates a chunk's channel-major block x ([D][kChunk]) whose first token is
  // at position `first` (rotate-half: channel c with c + D/2); with
  // `transpose`, rotates it back.
  void rotate(float* x, int64_t first, bool transpose) const {
    const float* cos = buffer_.get() + first;
    const float* sin = cos + half_ * stride_;
    for (int64_t c = 0; c < half_; ++c) {
      float* lo = x + c * kChunk;
      float* hi = x + (c + half_) * kChunk;
      for (int v = 0; v < kChunk; v += kSlice) {
        const Vector cs = load(cos + c * stride_ + v);
        const Vector sn = transpose ? -load(sin + c * stride_ + v) : load(sin + c * stride_ + v);
        const Vector a = load(lo + v), b = load(hi + v);
        store(lo + v, a * cs - b * sn);
        store(hi + v, b * cs + a * sn);
      }
    }
  }

 private:
  bool on_;
  int64_t half_, stride_;
  Buffer buffer_;
};

// One step's weights for one group, in the parameters' layout.
struct GroupWeights {
  const float* w1;  // [R, D]
  const float* b1;  // [R]
  const float* w2;  // [2D, R]
  const float* b2;  // [2D]
};

GroupWeights weights_at(const Problem& s, const kernels::AffineCouplingParams& p, int64_t step, int64_t group) {
  const int64_t D = s.head_dim, R = s.hidden;
  return {p.w1[step] + group * R * D, p.b1[step] + group * R, p.w2[step] + group * 2 * D * R,
          p.b2[step] + group * 2 * D};
}

// The conditioner of one step on the chunk's x: a = W1 x + b1, sig = sigmoid(a),
// h = silu(a), o = [s_raw; t] = W2 h + b2.
template <int R>
void conditioner(const GroupWeights& w, int64_t D, const float* x, ChunkScratch& ch) {
  for (int v = 0; v < kChunk; v += kSlice)
    for (int r0 = 0; r0 < R; r0 += kUnitBlock) {
      Vector acc[kUnitBlock];
#pragma GCC unroll 8
      for (int u = 0; u < kUnitBlock; ++u) acc[u] = Vector{} + w.b1[r0 + u];
      for (int64_t c = 0; c < D; ++c) {
        const Vector xc = load(x + c * kChunk + v);
#pragma GCC unroll 8
        for (int u = 0; u < kUnitBlock; ++u) acc[u] += w.w1[(r0 + u) * D + c] * xc;
      }
#pragma GCC unroll 8
      for (int u = 0; u < kUnitBlock; ++u) store(ch.a + (r0 + u) * kChunk + v, acc[u]);
    }
#pragma omp simd
  for (int n = 0; n < R * kChunk; ++n) {
    // Bounded so that exp stays finite: with fast math, 1 / (1 + inf) is NaN, not 0.
    ch.sig[n] = 1.0f / (1.0f + expf(fminf(-ch.a[n], kMaxExponent)));
    ch.h[n] = ch.a[n] * ch.sig[n];
  }
  for (int v = 0; v < kChunk; v += kSlice)
    for (int64_t m0 = 0; m0 < 2 * D; m0 += kUnitBlock) {
      Vector acc[kUnitBlock];
#pragma GCC unroll 8
      for (int u = 0; u < kUnitBlock; ++u) acc[u] = Vector{} + w.b2[m0 + u];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const Vector hr = load(ch.h + r * kChunk + v);
#pragma GCC unroll 8
        for (int u = 0; u < kUnitBlock; ++u) acc[u] += w.w2[(m0 + u) * R + r] * hr;
      }
#pragma GCC unroll 8
      for (int u = 0; u < kUnitBlock; ++u) store(ch.o + (m0 + u) * kChunk + v, acc[u]);
    }
}

// y <- y exp(s) + t for one step, s = clamp tanh(s_raw / clamp).
void update(const ChunkScratch& ch, int64_t D, float clamp, float* y) {
  const float inv_clamp = 1.0f / clamp;
  const float* t = ch.o + D * kChunk;
#pragma omp simd
  for (int64_t n = 0; n < D * kChunk; ++n) y[n] = y[n] * expf(clamp * tanhf(ch.o[n] * inv_clamp)) + t[n];
}

// One step's weight-gradient sums for the group a thread is on, one partial
// sum per lane: every chunk adds its products with vector adds, and the lanes
// are summed only when the thread moves to another group and at the end.
struct LaneSums {
  float* w1;  // [R * D][kSlice]
  float* b1;  // [R][kSlice]
  float* w2;  // [2D * R][kSlice]
  float* b2;  // [2D][kSlice]
};

class GradientLanes {
 public:
  explicit GradientLanes(const Problem& s)
      : s_(s),
        per_step_(3 * s.head_dim * s.hidden + s.hidden + 2 * s.head_dim),
        buffer_(s.steps * per_step_ * kSlice) {}

  LaneSums at(int64_t step) const {
    const int64_t D = s_.head_dim, R = s_.hidden;
    float* w1 = buffer_.get() + step * per_step_ * kSlice;
    float* b1 = w1 + R * D * kSlice;
    float* w2 = b1 + R * kSlice;
    float* b2 = w2 + 2 * D * R * kSlice;
    return {w1, b1, w2, b2};
  }

  // Adds every step's lane sums to group `group` of the gradients and zeroes them.
  void flush(int64_t group, const kernels::AffineCouplingGrads& grads) {
    const int64_t D = s_.head_dim, R = s_.hidden;
#pragma omp critical(cqk_cpu_coupling_gradients)
    for (int64_t i = 0; i < s_.steps; ++i) {
      // The parameters' layout per group is the lanes' layout: one sum per entry.
      const struct {
        float* out;
        int64_t size;
      } parts[] = {{grads.w1[i] + group * R * D, R * D},
                   {grads.b1[i] + group * R, R},
                   {grads.w2[i] + group * 2 * D * R, 2 * D * R},
                   {grads.b2[i] + group * 2 * D, 2 * D}};
      const float* lanes = at(i).w1;
      for (const auto& part : parts)
        for (int64_t e = 0; e < part.size; ++e, lanes += kSlice) {
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int t = 0; t < kSlice; ++t) sum += lanes[t];
          part.out[e] += sum;
        }
    }
    memset(buffer_.get(), 0, sizeof(float) * s_.steps * per_step_ * kSlice);
  }

 private:
  Problem s_;
  int64_t per_step_;
  Buffer buffer_;
};

// One step backwards for a chunk: y (this step's output) becomes its input,
// grad_y its input's gradient; grad_x gets the gradient through the
// conditioner, and the weight gradients go to `sums`. The input is rebuilt
// with the exact inverse y <- (y - t) exp(-s) from the same conditioner
// evaluation that the gradient needs.
template <int R>
void backward_step(const GroupWeights& w, const LaneSums& sums, int64_t D, float clamp, const float* x, float* y,
                   float* grad_x, float* grad_y, ChunkScratch& ch) {
  conditioner<R>(w, D, x, ch);
  const float inv_clamp = 1.0f / clamp;
  const float* t = ch.o + D * kChunk;
  float* grad_s_raw = ch.grad_o;
  float* grad_t = ch.grad_o + D * kChunk;
#pragma omp simd
  for (int64_t n = 0; n < D * kChunk; ++n) {
    const float th = tanhf(ch.o[n] * inv_clamp), s = clamp * th;
    const float shifted = y[n] - t[n];  // = y_in exp(s)
    const float g = grad_y[n];
    grad_s_raw[n] = g * shifted * (1.0f - th * th);  // through the soft clamp
    grad_t[n] = g;
    grad_y[n] = g * expf(s);
    y[n] = shifted * expf(-s);  // the exact inverse, as QKCoupling::inverse_transform
  }
  // Sums: b2 += grad_o, W2 += grad_o h^T.
  for (int64_t m = 0; m < 2 * D; ++m) {
    const float* go = ch.grad_o + m * kChunk;
    add_to(sums.b2 + m * kSlice, slice_sum(go));
    for (int r = 0; r < R; ++r) add_to(sums.w2 + (m * R + r) * kSlice, slice_dot(go, ch.h + r * kChunk));
  }
  // grad_h = W2^T grad_o, then grad_a = grad_h silu'(a) in its place.
  for (int v = 0; v < kChunk; v += kSlice)
    for (int r0 = 0; r0 < R; r0 += kUnitBlock) {
      Vector grad_h[kUnitBlock] = {};
      for (int64_t m = 0; m < 2 * D; ++m) {
        const Vector go = load(ch.grad_o + m * kChunk + v);
#pragma GCC unroll 8
        for (int u = 0; u < kUnitBlock; ++u) grad_h[u] += w.w2[m * R + r0 + u] * go;
      }
#pragma GCC unroll 8
      for (int u = 0; u < kUnitBlock; ++u) store(ch.grad_a + (r0 + u) * kChunk + v, grad_h[u]);
    }
#pragma omp simd
  for (int n = 0; n < R * kChunk; ++n) ch.grad_a[n] *= ch.sig[n] * (1.0f + ch.a[n] * (1.0f - ch.sig[n]));
  // Sums: b1 += grad_a, W1 += grad_a x^T.
  for (int r = 0; r < R; ++r) {
    const float* ga = ch.grad_a + r * kChunk;
    add_to(sums.b1 + r * kSlice, slice_sum(ga));
    for (int64_t c = 0; c < D; ++c) add_to(sums.w1 + (r * D + c) * kSlice, slice_dot(ga, x + c * kChunk));
  }
  // grad_x += W1^T grad_a.
  for (int v = 0; v < kChunk; v += kSlice)
    for (int r0 = 0; r0 < R; r0 += kUnitBlock) {
      Vector grad_a[kUnitBlock];
#pragma GCC unroll 8
      for (int u = 0; u < kUnitBlock; ++u) grad_a[u] = load(ch.grad_a + (r0 + u) * kChunk + v);
      for (int64_t c = 0; c < D; ++c) {
        Vector gx = load(grad_x + c * kChunk + v);
#pragma GCC unroll 8
        for (int u = 0; u < kUnitBlock; ++u) gx += w.w1[(r0 + u) * D + c] * grad_a[u];
        store(grad_x + c * kChunk + v, gx);
      }
    }
}

// The first row of chunk c in a tensor with these row strides.
int64_t chunk_row(const Chunk& c, const kernels::RowStrides& strides) {
  return c.batch * strides.batch + c.head * strides.head + c.first_token * strides.time;
}

template <int R>
void forward_all(const Problem& s, const kernels::AffineCouplingParams& params, const float* q,
                 const kernels::RowStrides& q_strides, const float* k, const kernels::RowStrides& k_strides,
                 float* q_out, float* k_out, const ChunkRopeTables& rope) {
  const int64_t D = s.head_dim, items = s.heads * s.batch * s.chunks_per_row;
#pragma omp parallel
  {
    ChunkScratch ch(s);
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      const Chunk c = chunk_at(s, item);
      load_chunk(q + chunk_row(c, q_strides), q_strides.time, c.tokens, D, ch.q);
      load_chunk(k + chunk_row(c, k_strides), k_strides.time, c.tokens, D, ch.k);
      for (int64_t i = 0; i < s.steps; ++i) {
        const bool even = i % 2 == 0;  // even steps update k from q
        conditioner<R>(weights_at(s, params, i, group_of(s, c)), D, even ? ch.q : ch.k, ch);
        update(ch, D, s.clamp, even ? ch.k : ch.q);
      }
      if (rope.on()) {
        rope.rotate(ch.q, c.first_token, /*transpose=*/false);
        rope.rotate(ch.k, c.first_token, /*transpose=*/false);
      }
      const int64_t out = ((c.batch * s.heads + c.head) * s.time + c.first_token) * D;
      store_chunk(ch.q, c.tokens, D, q_out + out);
      store_chunk(ch.k, c.tokens, D, k_out + out);
    }
  }
}

template <int R>
void backward_all(const Problem& s, const kernels::AffineCouplingParams& params, const float* q_out,
                  const float* k_out, const float* grad_q_out, const float* grad_k_out, float* grad_q,
                  float* grad_k, const kernels::AffineCouplingGrads& grads, const ChunkRopeTables& rope) {
  const int64_t D = s.head_dim, items = s.heads * s.batch * s.chunks_per_row;
#pragma omp parallel
  {
    ChunkScratch ch(s);
    GradientLanes lanes(s);
    int64_t group = -1;  // the group the lanes hold sums of
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      const Chunk c = chunk_at(s, item);
      if (group_of(s, c) != group) {
        if (group >= 0) lanes.flush(group, grads);
        group = group_of(s, c);
      }
      const int64_t rows = ((c.batch * s.heads + c.head) * s.time + c.first_token) * D;
      load_chunk(q_out + rows, D, c.tokens, D, ch.q);
      load_chunk(k_out + rows, D, c.tokens, D, ch.k);
      load_chunk(grad_q_out + rows, D, c.tokens, D, ch.grad_q);
      load_chunk(grad_k_out + rows, D, c.tokens, D, ch.grad_k);
      if (rope.on()) {  // RoPE came last: its transpose first, on the outputs and their gradients
        float* blocks[] = {ch.q, ch.k, ch.grad_q, ch.grad_k};
        for (float* block : blocks) rope.rotate(block, c.first_token, /*transpose=*/true);
      }
      // Lanes past the chunk's tokens carry zero gradients, so they add nothing to the sums.
      zero_lanes_past(c.tokens, D, ch.grad_q);
      zero_lanes_past(c.tokens, D, ch.grad_k);
      for (int64_t i = s.steps - 1; i >= 0; --i) {
        const bool even = i % 2 == 0;  // even steps updated k from q
        backward_step<R>(weights_at(s, params, i, group), lanes.at(i), D, s.clamp, even ? ch.q : ch.k,
                         even ? ch.k : ch.q, even ? ch.grad_q : ch.grad_k, even ? ch.grad_k : ch.grad_q, ch);
      }
      store_chunk(ch.grad_q, c.tokens, D, grad_q + rows);
      store_chunk(ch.grad_k, c.tokens, D, grad_k + rows);
    }
    if (group >= 0) lanes.flush(group, grads);
  }
}

}  // namespace

void forward(const kernels::CouplingShape& shape, const kernels::AffineCouplingParams& params, const float* q,
             const kernels::RowStrides& q_strides, const float* k, const kernels::RowStrides& k_strides,
             float* q_out, float* k_out, const kernels::RopeTables& rope) {
  const Problem s = problem_of(shape, params);
  const ChunkRopeTables tables(s, rope);
  if (s.hidden == 8) forward_all<8>(s, params, q, q_strides, k, k_strides, q_out, k_out, tables);
  else forward_all<16>(s, params, q, q_strides, k, k_strides, q_out, k_out, tables);
}

void backward(const kernels::CouplingShape& shape, const kernels::AffineCouplingParams& params, const float* q_out,
              const float* k_out, const float* grad_q_out, const float* grad_k_out, float* grad_q, float* grad_k,
              const kernels::AffineCouplingGrads& grads, const kernels::RopeTables& rope) {
  const Problem s = problem_of(shape, params);
  const ChunkRopeTables tables(s, rope);
  if (s.hidden == 8) backward_all<8>(s, params, q_out, k_out, grad_q_out, grad_k_out, grad_q, grad_k, grads, tables);
  else backward_all<16>(s, params, q_out, k_out, grad_q_out, grad_k_out, grad_q, grad_k, grads, tables);
}

}  // namespace cqk::cpu::CQK_SIMD_VARIANT
