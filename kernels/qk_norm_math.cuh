#pragma once
// QK-norm (RMSNorm of a head's q or k over its head_dim channels, with a
// learned scale per channel) as the fused coupling kernel applies it between
// the coupling and RoPE, on a token whose channels are spread over lanes
// (coupling_math.cuh: lane l holds channels 8l .. 8l+7). Shared by the kernel
// and its CPU test (tests/kernel_math_test.cpp), which emulates the lanes.
//
//   y_c = x_c r w_c,  r = 1 / sqrt(mean_c x_c^2 + eps)
//   dL/dx_j = r w_j g_j - x_j r^3 (1/D) sum_c x_c w_c g_c,  dL/dw_c = g_c x_c r
#include <cmath>

#include "coupling_math.cuh"  // CQK_HOST_DEVICE, kLaneChannels

namespace cqk::kernels {

// x <- its RMSNorm with weights w (the lane's 8 of them). `reduce` sums over the
// token's lanes; every lane of the token must call it together.
template <int D, class Reduce>
CQK_HOST_DEVICE void lane_rms_norm(float (&x)[kLaneChannels], const float* w, float eps, const Reduce& reduce) {
  float sum_sq[1] = {0.0f};
  CQK_UNROLL
  for (int i = 0; i < kLaneChannels; ++i) sum_sq[0] += x[i] * x[i];
  reduce(sum_sq);
  const float r = 1.0f / sqrtf(sum_sq[0] / D + eps);
  CQK_UNROLL
  for (int i = 0; i < kLaneChannels; ++i) x[i] *= r * w[i];
}

// g (the gradient of the normed output) <- the gradient of its input x; the
// weight gradient's terms g_c x_c r go to weight_grad (the caller sums them
// over tokens).
template <int D, class Reduce>
CQK_HOST_DEVICE void lane_rms_norm_backward(const float (&x)[kLaneChannels], float (&g)[kLaneChannels],
                                            const float* w, float eps, float (&weight_grad)[kLaneChannels],
                                            const Reduce& reduce) {
  float sums[2] = {0.0f, 0.0f};  // sum x^2, sum x w g
  CQK_UNROLL
  for (int i = 0; i < kLaneChannels; ++i) {
    sums[0] += x[i] * x[i];
    sums[1] += x[i] * w[i] * g[i];
  }
  reduce(sums);
  const float r = 1.0f / sqrtf(sums[0] / D + eps);
  const float projection = r * r * r * sums[1] / D;
  CQK_UNROLL
  for (int i = 0; i < kLaneChannels; ++i) {
    weight_grad[i] = g[i] * x[i] * r;
    g[i] = r * w[i] * g[i] - x[i] * projection;
  }
}

}  // namespace cqk::kernels
