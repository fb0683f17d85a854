#pragma once
// The affine coupling step for one token, shared by the CUDA kernels and the
// CPU tests (which compile it as plain C++ and compare it with the ATen path).
// Layout of one step's weights for one head, as in cqk::HeadwiseMLP:
//   w1 [R, D], b1 [R], w2 [2D, R] (rows 0..D-1 give s, D..2D-1 give t), b2 [2D].
#include <cmath>

#if defined(__CUDACC__)
#define CQK_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define CQK_HOST_DEVICE inline
#endif

namespace cqk::kernels {

struct AffineStepWeights {
  const float* w1;
  const float* b1;
  const float* w2;
  const float* b2;
};

CQK_HOST_DEVICE float silu(float x) { return x / (1.0f + expf(-x)); }

// s = c * tanh(s_raw / c): bounded scales keep exp(s) and its inverse finite.
CQK_HOST_DEVICE float soft_clamp(float s_raw, float clamp) { return clamp * tanhf(s_raw / clamp); }

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
  float hidden[R];
  conditioner_hidden<D, R>(x, w, hidden);
  for (int d = 0; d < D; ++d) {
    float s, t;
    conditioner_output<D, R>(hidden, w, d, clamp, &s, &t);
    y[d] = y[d] * expf(s) + t;
  }
}

// y <- (y - t(x)) * exp(-s(x)), in place: the exact inverse of the step above.
template <int D, int R>
CQK_HOST_DEVICE void affine_step_inverse(float* y, const float* x, const AffineStepWeights& w, float clamp) {
  float hidden[R];
  conditioner_hidden<D, R>(x, w, hidden);
  for (int d = 0; d < D; ++d) {
    float s, t;
    conditioner_output<D, R>(hidden, w, d, clamp, &s, &t);
    y[d] = (y[d] - t) * expf(-s);
  }
}

// All steps for one token: even steps update k from q, odd steps q from k.
template <int D, int R>
CQK_HOST_DEVICE void affine_coupling_forward(float* q, float* k, const AffineStepWeights* steps, int num_steps,
                                             float clamp) {
  for (int i = 0; i < num_steps; ++i) {
    if (i % 2 == 0) affine_step_forward<D, R>(k, q, steps[i], clamp);
    else affine_step_forward<D, R>(q, k, steps[i], clamp);
  }
}

template <int D, int R>
CQK_HOST_DEVICE void affine_coupling_inverse(float* q, float* k, const AffineStepWeights* steps, int num_steps,
                                             float clamp) {
  for (int i = num_steps - 1; i >= 0; --i) {
    if (i % 2 == 0) affine_step_inverse<D, R>(k, q, steps[i], clamp);
    else affine_step_inverse<D, R>(q, k, steps[i], clamp);
  }
}

}  // namespace cqk::kernels
