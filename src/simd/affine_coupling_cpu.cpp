// The kernels, compiled once per instruction set (src/simd/CMakeLists.txt:
// -O3 -ffast-math -fopenmp and the set's flags), each copy in the namespace
// cqk::cpu::CQK_SIMD_VARIANT; simd_dispatch.cpp picks one at run time. The
// loops over channels vectorise, and expf/tanhf in them become glibc's
// vector math (libmvec). This unit includes no torch or standard-library
// templates whose vector copies the linker could pick for code that runs on
// any x86-64 (the one-definition rule).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "simd_variants.h"

namespace cqk::cpu::CQK_SIMD_VARIANT {

namespace {

// Independent partial sums in the matrix-vector products (the head dim is a
// multiple of 8); the sums below add exactly four.
constexpr int kChains = 4;
static_assert(kChains == 4, "conditioner() and backward_step() add four partial sums");

// The shape with what the parameters add to it, derived once per call.
struct Problem {
  int64_t batch, heads, time, head_dim, hidden, steps;
  int64_t groups;  // weight sets per step: heads, or 1 when shared across heads
  float clamp;
};

Problem problem_of(const kernels::CouplingShape& s, const kernels::AffineCouplingParams& p) {
  return {s.batch, s.heads, s.time, s.head_dim, s.hidden, p.num_steps, p.shared_across_heads ? 1 : s.heads, p.clamp};
}

// One step's gradient accumulators for one group, in the weights' layout.
struct StepGradients {
  float* w1;
  float* b1;
  float* w2;
  float* b2;
};

// One step's weights for one group, with the transposes the forward reads
// along their contiguous dimension: w1t [D, R], w2t [R, 2D].
struct GroupWeights {
  const float* w1;  // [R, D]
  const float* b1;  // [R]
  const float* w2;  // [2D, R]
  const float* b2;  // [2D]
  const float* w1t;
  const float* w2t;
};

// Transposed copies of every step's and group's w1 and w2, made once per call (a few KiB).
class TransposedWeights {
 public:
  TransposedWeights(const Problem& shape, const kernels::AffineCouplingParams& params)
      : shape_(shape), params_(params) {
    const int64_t D = shape.head_dim, R = shape.hidden, per_group = 3 * D * R;
    data_ = static_cast<float*>(malloc(sizeof(float) * shape.steps * shape.groups * per_group));
    for (int64_t i = 0; i < shape.steps; ++i)
      for (int64_t g = 0; g < shape.groups; ++g) {
        float* w1t = data_ + (i * shape.groups + g) * per_group;
        float* w2t = w1t + D * R;
        const float* w1 = params.w1[i] + g * R * D;
        const float* w2 = params.w2[i] + g * 2 * D * R;
        for (int64_t r = 0; r < R; ++r)
          for (int64_t c = 0; c < D; ++c) w1t[c * R + r] = w1[r * D + c];
        for (int64_t m = 0; m < 2 * D; ++m)
          for (int64_t r = 0; r < R; ++r) w2t[r * 2 * D + m] = w2[m * R + r];
      }
  }
  ~TransposedWeights() { free(data_); }
  TransposedWeights(const TransposedWeights&) = delete;
  TransposedWeights& operator=(const TransposedWeights&) = delete;

  GroupWeights at(int64_t step, int64_t group) const {
    const int64_t D = shape_.head_dim, R = shape_.hidden;
    const float* w1t = data_ + (step * shape_.groups + group) * 3 * D * R;
    return {params_.w1[step] + group * R * D, params_.b1[step] + group * R, params_.w2[step] + group * 2 * D * R,
            params_.b2[step] + group * 2 * D, w1t, w1t + D * R};
  }

 private:
  Problem shape_;
  const kernels::AffineCouplingParams& params_;
  float* data_ = nullptr;
};

// The conditioner of one step on x: pre-activation a, sigmoid(a), h = silu(a), and o = [s_raw, t].
template <int R>
inline void conditioner(const GroupWeights& w, int64_t D, const float* x, float* a, float* sig, float* h, float* o) {
  // kChains independent sums: one running sum would wait on each add's latency.
  float partial[kChains][R] = {};
  for (int64_t c = 0; c < D; c += kChains)
    for (int u = 0; u < kChains; ++u) {
      const float xc = x[c + u];
      const float* row = w.w1t + (c + u) * R;
#pragma omp simd
      for (int r = 0; r < R; ++r) partial[u][r] += xc * row[r];
    }
#pragma omp simd
  for (int r = 0; r < R; ++r) a[r] = w.b1[r] + (partial[0][r] + partial[1][r]) + (partial[2][r] + partial[3][r]);
#pragma omp simd
  for (int r = 0; r < R; ++r) {
    // Bounded so that exp stays finite: with fast math, 1 / (1 + inf) is NaN, not 0.
    sig[r] = 1.0f / (1.0f + expf(fminf(-a[r], kMaxExponent)));
    h[r] = a[r] * sig[r];
  }
  memcpy(o, w.b2, sizeof(float) * 2 * D);
  for (int r = 0; r < R; ++r) {
    const float hr = h[r];
    const float* row = w.w2t + r * 2 * D;
#pragma omp simd
    for (int64_t m = 0; m < 2 * D; ++m) o[m] += hr * row[m];
  }
}

template <int R>
void forward_token(const Problem& shape, const TransposedWeights& weights, int64_t group, float* q,
                   float* k) {
  const int64_t D = shape.head_dim;
  const float clamp = shape.clamp, inv_clamp = 1.0f / shape.clamp;
  float a[R], sig[R], h[R], o[2 * kMaxHeadDim];
  for (int64_t i = 0; i < shape.steps; ++i) {
    const float* x = (i % 2 == 0) ? q : k;
    float* y = (i % 2 == 0) ? k : q;
    conditioner<R>(weights.at(i, group), D, x, a, sig, h, o);
#pragma omp simd
    for (int64_t c = 0; c < D; ++c) y[c] = y[c] * expf(clamp * tanhf(o[c] * inv_clamp)) + o[D + c];
  }
}

// One step backwards for one token: y (this step's output) becomes its input,
// gy its input's gradient; gx gets the gradient through the conditioner, and
// the weight gradients are added to gw (this thread's accumulators).
template <int R>
void backward_step(const GroupWeights& w, const StepGradients& gw, int64_t D, float clamp, const float* x,
                   float* y, float* gx, float* gy) {
  float a[R], sig[R], h[R], o[2 * kMaxHeadDim], go[2 * kMaxHeadDim];
  conditioner<R>(w, D, x, a, sig, h, o);
  const float inv_clamp = 1.0f / clamp;
#pragma omp simd
  for (int64_t c = 0; c < D; ++c) {
    const float th = tanhf(o[c] * inv_clamp), s = clamp * th, t = o[D + c];
    const float shifted = y[c] - t;  // = y_in exp(s)
    const float g = gy[c];
    go[c] = g * shifted * (1.0f - th * th);  // d/ds_raw through the soft clamp
    go[D + c] = g;                           // d/dt
    gy[c] = g * expf(s);
    y[c] = shifted * expf(-s);  // the exact inverse, as QKCoupling::inverse_transform
  }
  float partial[kChains][R] = {};  // of gh = W2^T go, as in conditioner()
  for (int64_t m = 0; m < 2 * D; m += kChains)
    for (int u = 0; u < kChains; ++u) {
      const float gm = go[m + u];
      const float* row = w.w2 + (m + u) * R;
      float* grow = gw.w2 + (m + u) * R;
#pragma omp simd
      for (int r = 0; r < R; ++r) {
        partial[u][r] += gm * row[r];
        grow[r] += gm * h[r];
      }
    }
  float gh[R];
#pragma omp simd
  for (int r = 0; r < R; ++r) gh[r] = (partial[0][r] + partial[1][r]) + (partial[2][r] + partial[3][r]);
#pragma omp simd
  for (int64_t m = 0; m < 2 * D; ++m) gw.b2[m] += go[m];
  for (int r = 0; r < R; ++r) {
    const float ga = gh[r] * sig[r] * (1.0f + a[r] * (1.0f - sig[r]));  // silu'(a)
    gw.b1[r] += ga;
    const float* row = w.w1 + r * D;
    float* grow = gw.w1 + r * D;
#pragma omp simd
    for (int64_t c = 0; c < D; ++c) {
      grow[c] += ga * x[c];
      gx[c] += ga * row[c];
    }
  }
}

// Per-thread weight-gradient accumulators for every step and group, in the weights' layout.
struct GradientBuffer {
  explicit GradientBuffer(const Problem& s)
      : per_step(s.groups * (3 * s.head_dim * s.hidden + s.hidden + 2 * s.head_dim)),
        data(static_cast<float*>(calloc(s.steps * per_step, sizeof(float)))) {}
  ~GradientBuffer() { free(data); }
  GradientBuffer(const GradientBuffer&) = delete;
  GradientBuffer& operator=(const GradientBuffer&) = delete;

  // Step i's accumulators for group g: w1 [R, D], b1 [R], w2 [2D, R], b2 [2D] of that group.
  StepGradients at(const Problem& s, int64_t i, int64_t g) const {
    const int64_t D = s.head_dim, R = s.hidden;
    float* base = data + i * per_step;
    float* w1 = base;                        // [G, R, D]
    float* b1 = w1 + s.groups * R * D;       // [G, R]
    float* w2 = b1 + s.groups * R;           // [G, 2D, R]
    float* b2 = w2 + s.groups * 2 * D * R;   // [G, 2D]
    return {w1 + g * R * D, b1 + g * R, w2 + g * 2 * D * R, b2 + g * 2 * D};
  }
  // Adds step i's accumulators (all groups) to the caller's gradients.
  void add_to(const Problem& s, int64_t i, const StepGradients& out) const {
    const int64_t D = s.head_dim, R = s.hidden, G = s.groups;
    const StepGradients mine = at(s, i, 0);
    for (int64_t n = 0; n < G * R * D; ++n) out.w1[n] += mine.w1[n];
    for (int64_t n = 0; n < G * R; ++n) out.b1[n] += mine.b1[n];
    for (int64_t n = 0; n < G * 2 * D * R; ++n) out.w2[n] += mine.w2[n];
    for (int64_t n = 0; n < G * 2 * D; ++n) out.b2[n] += mine.b2[n];
  }

  int64_t per_step;
  float* data;
};

template <int R>
void forward_all(const Problem& s, const kernels::AffineCouplingParams& params, const float* q, const float* k,
                 const kernels::RowStrides& strides, float* q_out, float* k_out) {
  const TransposedWeights weights(s, params);
  const int64_t D = s.head_dim, tokens = s.batch * s.heads * s.time;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < tokens; ++n) {
    const int64_t b = n / (s.heads * s.time), h = (n / s.time) % s.heads, t = n % s.time;
    const int64_t in = b * strides.batch + h * strides.head + t * strides.time;
    float* qn = q_out + n * D;
    float* kn = k_out + n * D;
    memcpy(qn, q + in, sizeof(float) * D);
    memcpy(kn, k + in, sizeof(float) * D);
    forward_token<R>(s, weights, s.groups == 1 ? 0 : (n / s.time) % s.heads, qn, kn);
  }
}

template <int R>
void backward_all(const Problem& s, const kernels::AffineCouplingParams& params, const float* q_out,
                  const float* k_out, const float* grad_q_out, const float* grad_k_out, float* grad_q,
                  float* grad_k, const kernels::AffineCouplingGrads& grads) {
  const TransposedWeights weights(s, params);
  const int64_t D = s.head_dim, tokens = s.batch * s.heads * s.time;
#pragma omp parallel
  {
    GradientBuffer local(s);
    float q[kMaxHeadDim], k[kMaxHeadDim];
#pragma omp for schedule(static)
    for (int64_t n = 0; n < tokens; ++n) {
      const int64_t group = s.groups == 1 ? 0 : (n / s.time) % s.heads;
      memcpy(q, q_out + n * D, sizeof(float) * D);
      memcpy(k, k_out + n * D, sizeof(float) * D);
      float* gq = grad_q + n * D;
      float* gk = grad_k + n * D;
      memcpy(gq, grad_q_out + n * D, sizeof(float) * D);
      memcpy(gk, grad_k_out + n * D, sizeof(float) * D);
      for (int64_t i = s.steps - 1; i >= 0; --i) {
        const bool even = i % 2 == 0;  // even steps updated k from q
        backward_step<R>(weights.at(i, group), local.at(s, i, group), D, s.clamp, even ? q : k, even ? k : q,
                         even ? gq : gk, even ? gk : gq);
      }
    }
#pragma omp critical
    for (int64_t i = 0; i < s.steps; ++i) local.add_to(s, i, {grads.w1[i], grads.b1[i], grads.w2[i], grads.b2[i]});
  }
}

}  // namespace

void forward(const kernels::CouplingShape& shape, const kernels::AffineCouplingParams& params, const float* q,
             const float* k, const kernels::RowStrides& strides, float* q_out, float* k_out) {
  const Problem s = problem_of(shape, params);
  if (s.hidden == 8) forward_all<8>(s, params, q, k, strides, q_out, k_out);
  else forward_all<16>(s, params, q, k, strides, q_out, k_out);
}

void backward(const kernels::CouplingShape& shape, const kernels::AffineCouplingParams& params, const float* q_out,
              const float* k_out, const float* grad_q_out, const float* grad_k_out, float* grad_q, float* grad_k,
              const kernels::AffineCouplingGrads& grads) {
  const Problem s = problem_of(shape, params);
  if (s.hidden == 8) backward_all<8>(s, params, q_out, k_out, grad_q_out, grad_k_out, grad_q, grad_k, grads);
  else backward_all<16>(s, params, q_out, k_out, grad_q_out, grad_k_out, grad_q, grad_k, grads);
}

}  // namespace cqk::cpu::CQK_SIMD_VARIANT
