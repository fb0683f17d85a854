#pragma once
// The affine coupling for one token, shared by the CUDA kernels and the CPU
// tests (which compile it as plain C++ and compare it with the ATen path).
//
// Layout of one step's weights for one head, as in cqk::HeadwiseMLP:
//   w1 [R, D], b1 [R], w2 [2D, R] (rows 0..D-1 give s, D..2D-1 give t), b2 [2D].
// One step, with x the conditioning vector and y the updated one:
//   a = W1 x + b1,  h = silu(a),  s = c tanh((W2s h + b2s) / c),  t = W2t h + b2t
//   y <- y * exp(s) + t               (forward)
//   y <- (y - t) * exp(-s)            (exact inverse)
// Even steps update k from q, odd steps q from k.
//
// The kernels split the D channels of a token over a group of L "lanes" (L = D /
// kLaneChannels GPU threads); the only cross-channel operations are the two
// R-vectors W1 x and W2^T g, which each lane computes over its own channels and
// a Reduce functor sums over the group (warp shuffles on the GPU, nothing for a
// single lane owning all D channels on the CPU). Everything in between is the
// per-lane code below, written once and run both ways:
//   - lane_coupling_forward / lane_coupling_inverse / lane_coupling_backward
//     take a weight view (DenseStepView: the torch layout; PackedStepView: the
//     kernels' shared-memory layout), a Reduce and, for the backward, a Sink that
//     receives each step's per-token weight-gradient factors.
//   - The classic per-token API (affine_coupling_forward/inverse/backward over
//     AffineStepWeights) is the single-lane instance with the dense view.
#include <cmath>

#if defined(__CUDACC__)
#define CQK_HOST_DEVICE __host__ __device__ __forceinline__
#define CQK_UNROLL _Pragma("unroll")
#else
#define CQK_HOST_DEVICE inline
#define CQK_UNROLL
#endif

namespace cqk::kernels {

// Pointers to one step's weights for one head, in the torch layout (see above).
struct AffineStepWeights {
  const float* w1;
  const float* b1;
  const float* w2;
  const float* b2;
};

// Gradient accumulators for one step's weights, same layout; the backward adds to them.
struct AffineStepGrads {
  float* w1;
  float* b1;
  float* w2;
  float* b2;
};

// Channels each lane of a kernel thread group owns: 8 bf16 values are one
// 16-byte load, 8 floats two.
constexpr int kLaneChannels = 8;

struct alignas(16) Vec4 {
  float v[4];
};

// Four consecutive floats from a 16-byte aligned address (one 128-bit load on the GPU).
CQK_HOST_DEVICE Vec4 load4_aligned(const float* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const Vec4*>(p);
#else
  return Vec4{{p[0], p[1], p[2], p[3]}};
#endif
}

// Four consecutive floats, no alignment assumed.
CQK_HOST_DEVICE Vec4 load4(const float* p) { return Vec4{{p[0], p[1], p[2], p[3]}}; }

CQK_HOST_DEVICE float silu(float x) { return x / (1.0f + expf(-x)); }

// d silu(a) / da = sig(a) (1 + a (1 - sig(a))).
CQK_HOST_DEVICE float silu_grad(float a) {
  const float sig = 1.0f / (1.0f + expf(-a));
  return sig * (1.0f + a * (1.0f - sig));
}

// s = c * tanh(s_raw / c): bounded scales keep exp(s) and its inverse finite.
CQK_HOST_DEVICE float soft_clamp(float s_raw, float clamp) { return clamp * tanhf(s_raw / clamp); }

// ---------------------------------------------------------------------------
// Weight views. Each returns groups of four values; `c` is an absolute channel
// index (a multiple of 4 where four channels are returned).

// The torch layout, read straight from the parameter tensors.
template <int D, int R>
struct DenseStepView {
  AffineStepWeights w;
  CQK_HOST_DEVICE Vec4 w1(int r, int c) const { return load4(w.w1 + r * D + c); }  // W1[r, c..c+3]
  CQK_HOST_DEVICE float b1(int r) const { return w.b1[r]; }
  CQK_HOST_DEVICE Vec4 w2s(int c, int r4) const { return load4(w.w2 + c * R + 4 * r4); }  // W2[c, 4r4..4r4+3]
  CQK_HOST_DEVICE Vec4 w2t(int c, int r4) const { return load4(w.w2 + (D + c) * R + 4 * r4); }
  CQK_HOST_DEVICE Vec4 b2s(int c) const { return load4(w.b2 + c); }
  CQK_HOST_DEVICE Vec4 b2t(int c) const { return load4(w.b2 + D + c); }
};

// The kernels' shared-memory layout of one step: the same values, permuted so
// that the lanes of a group (lane l owns channels 8l..8l+7) read consecutive
// 16-byte words at every access (no bank conflicts), and every access is one
// aligned 128-bit load. All section offsets are multiples of 4 floats.
template <int D, int R>
struct PackedStepLayout {
  static_assert(D % kLaneChannels == 0 && R % 4 == 0, "head_dim must be a multiple of 8 and hidden of 4");
  static constexpr int L = D / kLaneChannels;  // lanes per token
  static constexpr int kW1 = 0;
  static constexpr int kB1 = R * D;
  static constexpr int kW2S = kB1 + R;
  static constexpr int kW2T = kW2S + D * R;
  static constexpr int kB2S = kW2T + D * R;
  static constexpr int kB2T = kB2S + D;
  static constexpr int kFloats = kB2T + D;  // = 3DR + R + 2D, the parameter count of one step

  // Slot of channel c of a D-vector (a W1 row, b2s, b2t): [half][lane][4].
  CQK_HOST_DEVICE static int channel_slot(int c) {
    const int l = c / kLaneChannels, half = (c % kLaneChannels) / 4, e = c % 4;
    return half * (D / 2) + l * 4 + e;
  }
  // Slot of W2[c, r] within its D x R half: [j = c % 8][r / 4][lane][r % 4].
  CQK_HOST_DEVICE static int w2_slot(int c, int r) {
    const int l = c / kLaneChannels, j = c % kLaneChannels;
    return ((j * (R / 4) + r / 4) * L + l) * 4 + r % 4;
  }
  // Channel of D-vector slot p (inverse of channel_slot).
  CQK_HOST_DEVICE static int slot_channel(int p) {
    const int half = p / (D / 2), rem = p % (D / 2);
    return (rem / 4) * kLaneChannels + half * 4 + rem % 4;
  }
  // The value packed slot o holds, gathered from the torch layout (so that a
  // whole thread block can pack in parallel, one slot per thread).
  CQK_HOST_DEVICE static float gather(const AffineStepWeights& w, int o) {
    if (o < kB1) return w.w1[(o / D) * D + slot_channel(o % D)];
    if (o < kW2S) return w.b1[o - kB1];
    if (o < kB2S) {
      const int half = o < kW2T ? 0 : 1;
      const int p = o - (half == 0 ? kW2S : kW2T);
      const int e = p % 4, l = (p / 4) % L, jr = p / (4 * L);
      const int r = (jr % (R / 4)) * 4 + e, c = l * kLaneChannels + jr / (R / 4);
      return w.w2[(half * D + c) * R + r];
    }
    if (o < kB2T) return w.b2[slot_channel(o - kB2S)];
    return w.b2[D + slot_channel(o - kB2T)];
  }
};

template <int D, int R>
struct PackedStepView {
  using Layout = PackedStepLayout<D, R>;
  const float* p;  // kFloats floats, 16-byte aligned
  CQK_HOST_DEVICE Vec4 w1(int r, int c) const { return load4_aligned(p + Layout::kW1 + r * D + Layout::channel_slot(c)); }
  CQK_HOST_DEVICE float b1(int r) const { return p[Layout::kB1 + r]; }
  CQK_HOST_DEVICE Vec4 w2s(int c, int r4) const { return load4_aligned(p + Layout::kW2S + Layout::w2_slot(c, 4 * r4)); }
  CQK_HOST_DEVICE Vec4 w2t(int c, int r4) const { return load4_aligned(p + Layout::kW2T + Layout::w2_slot(c, 4 * r4)); }
  CQK_HOST_DEVICE Vec4 b2s(int c) const { return load4_aligned(p + Layout::kB2S + Layout::channel_slot(c)); }
  CQK_HOST_DEVICE Vec4 b2t(int c) const { return load4_aligned(p + Layout::kB2T + Layout::channel_slot(c)); }
};

// ---------------------------------------------------------------------------
// Per-lane pieces of one step. A lane owns channels c0 .. c0+CPL-1.

// a[r] = sum over the lane's channels of W1[r, c] x[c] (no bias: the bias is
// added once, after the reduction over lanes).
template <int R, int CPL, class W>
CQK_HOST_DEVICE void hidden_partial(const W& w, int c0, const float (&x)[CPL], float (&a)[R]) {
  CQK_UNROLL
  for (int r = 0; r < R; ++r) a[r] = 0.0f;
  CQK_UNROLL
  for (int i = 0; i < CPL; i += 4) {
    CQK_UNROLL
    for (int r = 0; r < R; ++r) {
      const Vec4 wv = w.w1(r, c0 + i);
      CQK_UNROLL
      for (int e = 0; e < 4; ++e) a[r] += wv.v[e] * x[i + e];
    }
  }
}

// a <- a + b1 (a: the reduced W1 x), h = silu(a).
template <int R, class W>
CQK_HOST_DEVICE void hidden_activate(const W& w, float (&a)[R], float (&h)[R]) {
  CQK_UNROLL
  for (int r = 0; r < R; ++r) {
    a[r] += w.b1(r);
    h[r] = silu(a[r]);
  }
}

// Raw log-scale and shift of channels c..c+3 from the hidden activations.
template <int R, class W>
CQK_HOST_DEVICE void scale_shift4(const W& w, int c, const float (&h)[R], float (&s_raw)[4], float (&t)[4]) {
  const Vec4 bs = w.b2s(c), bt = w.b2t(c);
  CQK_UNROLL
  for (int e = 0; e < 4; ++e) {
    s_raw[e] = bs.v[e];
    t[e] = bt.v[e];
    CQK_UNROLL
    for (int r4 = 0; r4 < R / 4; ++r4) {
      const Vec4 ws = w.w2s(c + e, r4), wt = w.w2t(c + e, r4);
      CQK_UNROLL
      for (int j = 0; j < 4; ++j) {
        s_raw[e] += ws.v[j] * h[4 * r4 + j];
        t[e] += wt.v[j] * h[4 * r4 + j];
      }
    }
  }
}

// y <- y exp(s) + t (or its inverse) over the lane's channels.
template <int R, int CPL, bool Inverse, class W>
CQK_HOST_DEVICE void step_channels(const W& w, int c0, const float (&h)[R], float clamp, float (&y)[CPL]) {
  CQK_UNROLL
  for (int i = 0; i < CPL; i += 4) {
    float s_raw[4], t[4];
    scale_shift4<R>(w, c0 + i, h, s_raw, t);
    CQK_UNROLL
    for (int e = 0; e < 4; ++e) {
      const float s = soft_clamp(s_raw[e], clamp);
      y[i + e] = Inverse ? (y[i + e] - t[e]) * expf(-s) : y[i + e] * expf(s) + t[e];
    }
  }
}

// Backward of one step over the lane's channels. In: y = the step's output,
// gy = dL/dy_out. Out: y = the step's input (exact inverse), gy = dL/dy_in,
// gsr = dL/ds_raw, gt = dL/dt, gh = this lane's part of dL/dh = W2s^T gsr + W2t^T gt.
//   dL/dy_in = gy exp(s);  dL/ds = gy y_in exp(s) = gy (y_out - t);
//   dL/ds_raw = dL/ds (1 - tanh^2(s_raw / c));  dL/dt = gy.
// One channel at a time, so that each row of W2 is read once and used for both
// its output and its gradient while in registers.
template <int R, int CPL, class W>
CQK_HOST_DEVICE void step_channels_backward(const W& w, int c0, const float (&h)[R], float clamp, float (&y)[CPL],
                                            float (&gy)[CPL], float (&gsr)[CPL], float (&gt)[CPL], float (&gh)[R]) {
  CQK_UNROLL
  for (int r = 0; r < R; ++r) gh[r] = 0.0f;
  CQK_UNROLL
  for (int i = 0; i < CPL; i += 4) {
    const Vec4 bs = w.b2s(c0 + i), bt = w.b2t(c0 + i);
    CQK_UNROLL
    for (int e = 0; e < 4; ++e) {
      Vec4 ws[R / 4], wt[R / 4];
      float s_raw = bs.v[e], t = bt.v[e];
      CQK_UNROLL
      for (int r4 = 0; r4 < R / 4; ++r4) {
        ws[r4] = w.w2s(c0 + i + e, r4);
        wt[r4] = w.w2t(c0 + i + e, r4);
        CQK_UNROLL
        for (int j = 0; j < 4; ++j) {
          s_raw += ws[r4].v[j] * h[4 * r4 + j];
          t += wt[r4].v[j] * h[4 * r4 + j];
        }
      }
      const float th = tanhf(s_raw / clamp);
      const float s = clamp * th;  // == soft_clamp(s_raw, clamp), bit for bit
      const float g = gy[i + e];
      const float centered = y[i + e] - t;  // y_in * exp(s)
      const float g_s_raw = g * centered * (1.0f - th * th);
      gsr[i + e] = g_s_raw;
      gt[i + e] = g;
      y[i + e] = centered * expf(-s);
      gy[i + e] = g * expf(s);
      CQK_UNROLL
      for (int r4 = 0; r4 < R / 4; ++r4) {
        CQK_UNROLL
        for (int j = 0; j < 4; ++j) gh[4 * r4 + j] += ws[r4].v[j] * g_s_raw + wt[r4].v[j] * g;
      }
    }
  }
}

// g <- g * silu'(a): from dL/dh to dL/da (a includes b1).
template <int R>
CQK_HOST_DEVICE void hidden_backward(const float (&a)[R], float (&g)[R]) {
  CQK_UNROLL
  for (int r = 0; r < R; ++r) g[r] *= silu_grad(a[r]);
}

// gx += W1^T ga over the lane's channels.
template <int R, int CPL, class W>
CQK_HOST_DEVICE void conditioner_input_grad(const W& w, int c0, const float (&ga)[R], float (&gx)[CPL]) {
  CQK_UNROLL
  for (int i = 0; i < CPL; i += 4) {
    CQK_UNROLL
    for (int r = 0; r < R; ++r) {
      const Vec4 wv = w.w1(r, c0 + i);
      CQK_UNROLL
      for (int e = 0; e < 4; ++e) gx[i + e] += wv.v[e] * ga[r];
    }
  }
}

// ---------------------------------------------------------------------------
// Per-lane drivers. Views: callable, views(i) gives step i's weight view.
// Reduce: reduce(float (&v)[R]) sums v over the lanes of the group in place
// (every lane must end with the same bits). All lanes of a group must call
// these together (the GPU reduction is a warp shuffle).

struct NoReduce {
  template <int N>
  CQK_HOST_DEVICE void operator()(float (&)[N]) const {}
};

template <int R, int CPL, bool Inverse, class W, class Reduce>
CQK_HOST_DEVICE void lane_step(const W& w, int c0, float clamp, float (&y)[CPL], const float (&x)[CPL],
                               const Reduce& reduce) {
  float a[R], h[R];
  hidden_partial<R, CPL>(w, c0, x, a);
  reduce(a);
  hidden_activate<R>(w, a, h);
  step_channels<R, CPL, Inverse>(w, c0, h, clamp, y);
}

template <int R, int CPL, class Views, class Reduce>
CQK_HOST_DEVICE void lane_coupling_forward(const Views& views, int num_steps, float clamp, int c0, float (&q)[CPL],
                                           float (&k)[CPL], const Reduce& reduce) {
  for (int i = 0; i < num_steps; ++i) {
    // Two inlined copies instead of a run-time choice of array, which would
    // move the register arrays to local memory on the GPU.
    if (i % 2 == 0) lane_step<R, CPL, false>(views(i), c0, clamp, k, q, reduce);
    else lane_step<R, CPL, false>(views(i), c0, clamp, q, k, reduce);
  }
}

template <int R, int CPL, class Views, class Reduce>
CQK_HOST_DEVICE void lane_coupling_inverse(const Views& views, int num_steps, float clamp, int c0, float (&q)[CPL],
                                           float (&k)[CPL], const Reduce& reduce) {
  for (int i = num_steps - 1; i >= 0; --i) {
    if (i % 2 == 0) lane_step<R, CPL, true>(views(i), c0, clamp, k, q, reduce);
    else lane_step<R, CPL, true>(views(i), c0, clamp, q, k, reduce);
  }
}

// Backward of one step: y, gy as in step_channels_backward; x the conditioner
// input (unchanged by the step), gx += its gradient. Calls
//   sink(step, c0, x, gsr, gt, h, ga)
// with this token's factors of the weight gradients (ga = dL/da):
//   dW1 += ga x^T, db1 += ga, dW2s += gsr h^T, dW2t += gt h^T, db2s += gsr, db2t += gt.
template <int R, int CPL, class W, class Reduce, class Sink>
CQK_HOST_DEVICE void lane_step_backward(const W& w, int step, int c0, float clamp, float (&y)[CPL], float (&gy)[CPL],
                                        const float (&x)[CPL], float (&gx)[CPL], const Reduce& reduce, Sink& sink) {
  float a[R], h[R], g[R], gsr[CPL], gt[CPL];
  hidden_partial<R, CPL>(w, c0, x, a);
  reduce(a);
  hidden_activate<R>(w, a, h);
  step_channels_backward<R, CPL>(w, c0, h, clamp, y, gy, gsr, gt, g);
  reduce(g);
  hidden_backward<R>(a, g);
  conditioner_input_grad<R, CPL>(w, c0, g, gx);
  sink(step, c0, x, gsr, gt, h, g);
}

// In: q, k = the coupling's outputs, gq, gk = dL/d(outputs). Out: q, k = the
// inputs rebuilt with the exact inverse, gq, gk = dL/d(inputs); the weight
// gradients go to the sink, one call per step (last step first).
template <int R, int CPL, class Views, class Reduce, class Sink>
CQK_HOST_DEVICE void lane_coupling_backward(const Views& views, int num_steps, float clamp, int c0, float (&q)[CPL],
                                            float (&k)[CPL], float (&gq)[CPL], float (&gk)[CPL], const Reduce& reduce,
                                            Sink& sink) {
  for (int i = num_steps - 1; i >= 0; --i) {
    if (i % 2 == 0) lane_step_backward<R, CPL>(views(i), i, c0, clamp, k, gk, q, gq, reduce, sink);
    else lane_step_backward<R, CPL>(views(i), i, c0, clamp, q, gq, k, gk, reduce, sink);
  }
}

// ---------------------------------------------------------------------------
// Weight gradients: per-token factors to accumulators.

// Dense accumulators of one step, the torch layout in one block of floats:
// w1 [R*D], b1 [R], w2 [2D*R], b2 [2D].
template <int D, int R>
struct GradLayout {
  static constexpr int kW1 = 0;
  static constexpr int kB1 = R * D;
  static constexpr int kW2 = kB1 + R;
  static constexpr int kB2 = kW2 + 2 * D * R;
  static constexpr int kFloats = kB2 + 2 * D;
  // Work items of weight_grad_task: one per row of W2 (with its b2 entry), one
  // per (channel, group of 4 hidden units) of W1 (channel 0 also does b1).
  static constexpr int kTasks = 2 * D + D * (R / 4);
};

// Adds one token's factors straight into dense gradients (the CPU reference).
template <int D, int R>
struct DenseGradSink {
  const AffineStepGrads* grads;  // one per step
  template <int CPL>
  CQK_HOST_DEVICE void operator()(int step, int c0, const float (&x)[CPL], const float (&gsr)[CPL],
                                  const float (&gt)[CPL], const float (&h)[R], const float (&ga)[R]) const {
    const AffineStepGrads& g = grads[step];
    for (int i = 0; i < CPL; ++i) {
      const int c = c0 + i;
      for (int r = 0; r < R; ++r) {
        g.w2[c * R + r] += gsr[i] * h[r];
        g.w2[(D + c) * R + r] += gt[i] * h[r];
        g.w1[r * D + c] += ga[r] * x[i];
      }
      g.b2[c] += gsr[i];
      g.b2[D + c] += gt[i];
    }
    if (c0 == 0)
      for (int r = 0; r < R; ++r) g.b1[r] += ga[r];
  }
};

// The kernels stage the factors of a batch of n tokens in shared memory:
//   g2 [n][2D] (gsr then gt), xs [n][D], hg [n][2R] (h then ga),
// and then each thread sums outer products over the batch for its tasks into
// the block's accumulators (GradLayout). Tasks have disjoint outputs, so they
// need no atomics.
template <int D, int R>
CQK_HOST_DEVICE void weight_grad_task(int task, int n, const float* g2, const float* xs, const float* hg,
                                      float* acc) {
  using G = GradLayout<D, R>;
  if (task < 2 * D) {
    float sum[R], bias = 0.0f;
    CQK_UNROLL
    for (int r = 0; r < R; ++r) sum[r] = 0.0f;
    for (int j = 0; j < n; ++j) {
      const float g = g2[j * 2 * D + task];
      bias += g;
      CQK_UNROLL
      for (int r4 = 0; r4 < R / 4; ++r4) {
        const Vec4 hv = load4_aligned(hg + j * 2 * R + 4 * r4);
        CQK_UNROLL
        for (int e = 0; e < 4; ++e) sum[4 * r4 + e] += g * hv.v[e];
      }
    }
    CQK_UNROLL
    for (int r = 0; r < R; ++r) acc[G::kW2 + task * R + r] += sum[r];
    acc[G::kB2 + task] += bias;
  } else {
    const int t = task - 2 * D, r4 = t / D, d = t % D;
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f}, bias[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int j = 0; j < n; ++j) {
      const float xv = xs[j * D + d];
      const Vec4 ga = load4_aligned(hg + j * 2 * R + R + 4 * r4);
      CQK_UNROLL
      for (int e = 0; e < 4; ++e) {
        sum[e] += ga.v[e] * xv;
        bias[e] += ga.v[e];
      }
    }
    CQK_UNROLL
    for (int e = 0; e < 4; ++e) acc[G::kW1 + (4 * r4 + e) * D + d] += sum[e];
    if (d == 0) {
      CQK_UNROLL
      for (int e = 0; e < 4; ++e) acc[G::kB1 + 4 * r4 + e] += bias[e];
    }
  }
}

// ---------------------------------------------------------------------------
// The per-token API in the torch layout: one lane owning all D channels.

template <int D, int R>
struct DenseViews {
  const AffineStepWeights* steps;
  CQK_HOST_DEVICE DenseStepView<D, R> operator()(int i) const { return DenseStepView<D, R>{steps[i]}; }
};

// hidden[R] = silu(w1 x + b1) for the conditioning vector x[D].
template <int D, int R>
CQK_HOST_DEVICE void conditioner_hidden(const float* x, const AffineStepWeights& w, float* hidden) {
  for (int r = 0; r < R; ++r) {
    float acc = w.b1[r];
    for (int d = 0; d < D; ++d) acc += w.w1[r * D + d] * x[d];
    hidden[r] = silu(acc);
  }
}

// Scale and shift for channel d of the updated vector.
template <int D, int R>
CQK_HOST_DEVICE void conditioner_output(const float* hidden, const AffineStepWeights& w, int d, float clamp,
                                        float* s, float* t) {
  float s_raw = w.b2[d];
  float shift = w.b2[D + d];
  for (int r = 0; r < R; ++r) {
    s_raw += w.w2[d * R + r] * hidden[r];
    shift += w.w2[(D + d) * R + r] * hidden[r];
  }
  *s = soft_clamp(s_raw, clamp);
  *t = shift;
}

// y <- y * exp(s(x)) + t(x), in place.
template <int D, int R>
CQK_HOST_DEVICE void affine_step_forward(float* y, const float* x, const AffineStepWeights& w, float clamp) {
  lane_step<R, D, false>(DenseStepView<D, R>{w}, 0, clamp, *reinterpret_cast<float(*)[D]>(y),
                         *reinterpret_cast<const float(*)[D]>(x), NoReduce{});
}

// y <- (y - t(x)) * exp(-s(x)), in place: the exact inverse of the step above.
template <int D, int R>
CQK_HOST_DEVICE void affine_step_inverse(float* y, const float* x, const AffineStepWeights& w, float clamp) {
  lane_step<R, D, true>(DenseStepView<D, R>{w}, 0, clamp, *reinterpret_cast<float(*)[D]>(y),
                        *reinterpret_cast<const float(*)[D]>(x), NoReduce{});
}

// All steps for one token: even steps update k from q, odd steps q from k.
template <int D, int R>
CQK_HOST_DEVICE void affine_coupling_forward(float* q, float* k, const AffineStepWeights* steps, int num_steps,
                                             float clamp) {
  lane_coupling_forward<R, D>(DenseViews<D, R>{steps}, num_steps, clamp, 0, *reinterpret_cast<float(*)[D]>(q),
                              *reinterpret_cast<float(*)[D]>(k), NoReduce{});
}

template <int D, int R>
CQK_HOST_DEVICE void affine_coupling_inverse(float* q, float* k, const AffineStepWeights* steps, int num_steps,
                                             float clamp) {
  lane_coupling_inverse<R, D>(DenseViews<D, R>{steps}, num_steps, clamp, 0, *reinterpret_cast<float(*)[D]>(q),
                              *reinterpret_cast<float(*)[D]>(k), NoReduce{});
}

// Backward for one token. In: q, k = outputs of affine_coupling_forward, gq, gk
// = upstream gradients. Out: q, k = the rebuilt inputs, gq, gk = gradients of
// the inputs; this token's weight gradients are added to grads[0..num_steps).
template <int D, int R>
CQK_HOST_DEVICE void affine_coupling_backward(float* q, float* k, float* gq, float* gk, const AffineStepWeights* steps,
                                              int num_steps, float clamp, const AffineStepGrads* grads) {
  DenseGradSink<D, R> sink{grads};
  lane_coupling_backward<R, D>(DenseViews<D, R>{steps}, num_steps, clamp, 0, *reinterpret_cast<float(*)[D]>(q),
                               *reinterpret_cast<float(*)[D]>(k), *reinterpret_cast<float(*)[D]>(gq),
                               *reinterpret_cast<float(*)[D]>(gk), NoReduce{}, sink);
}

}  // namespace cqk::kernels
