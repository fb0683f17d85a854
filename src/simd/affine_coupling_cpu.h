#pragma once
// The affine coupling on the CPU in one pass per token, with raw pointers and
// no torch headers: this unit is compiled for AVX2/FMA with OpenMP (see
// src/CMakeLists.txt), so torch's inline code must never be compiled here.
// The math is that of kernels/coupling_math.cuh and QKCoupling::transform:
//   step i (even: k from q, odd: q from k), x the conditioning vector, y the updated one,
//   a = W1 x + b1, h = silu(a), s = c tanh((W2s h + b2s) / c), t = W2t h + b2t, y <- y exp(s) + t.
// The backward walks the steps in reverse, rebuilding each step's input with
// the exact inverse y <- (y - t) exp(-s) from the same conditioner evaluation
// that its gradient needs, so nothing but the outputs is kept.
#include <cstdint>

namespace cqk::cpu {

struct AffineCouplingShape {
  int64_t batch = 0, heads = 0, time = 0;
  int64_t head_dim = 0;  // D: a multiple of 8
  int64_t hidden = 0;    // R: 8 or 16
  int64_t steps = 0;
  int64_t groups = 0;  // weight sets per step: heads, or 1 when shared across heads
  float clamp = 1.0f;
};

// One step's weights (float32, contiguous), the layout of cqk::HeadwiseMLP:
// w1 [G, R, D], b1 [G, R], w2 [G, 2D, R], b2 [G, 2D].
struct AffineStepWeights {
  const float* w1;
  const float* b1;
  const float* w2;
  const float* b2;
};
struct AffineStepGradients {
  float* w1;
  float* b1;
  float* w2;
  float* b2;
};

// Whether this machine runs the compiled kernels (AVX2 and FMA) and the shape is compiled.
bool affine_coupling_supported(const AffineCouplingShape& shape);

// Element strides of q and k (the same for both) over batch, head and time;
// channels are contiguous. A [batch, time, heads, D] projection viewed as
// [batch, heads, time, D] is read in place.
struct TokenStrides {
  int64_t batch = 0, head = 0, time = 0;
};

// q, k: [batch, heads, time, D] float32 with `strides`; q_out, k_out: the same,
// contiguous. Uses the OpenMP threads torch is set to (the same runtime; see
// docs/ARCHITECTURE.md).
void affine_coupling_forward(const AffineCouplingShape& shape, const AffineStepWeights* steps, const float* q,
                             const float* k, const TokenStrides& strides, float* q_out, float* k_out);

// From the outputs and their gradients (all contiguous): the inputs' gradients
// (written, contiguous) and the weights' gradients (ADDED to, one
// AffineStepGradients per step).
void affine_coupling_backward(const AffineCouplingShape& shape, const AffineStepWeights* steps, const float* q_out,
                              const float* k_out, const float* grad_q_out, const float* grad_k_out, float* grad_q,
                              float* grad_k, const AffineStepGradients* step_grads);

}  // namespace cqk::cpu
