// RMSNorm over rows, forward and backward in one pass each, compiled once per
// instruction set like affine_coupling_cpu.cpp (see src/simd/CMakeLists.txt).
// ATen runs the module's pow, mean, rsqrt and two products, and their
// backwards, as a dozen passes over the activations.
#include <math.h>
#include <stdlib.h>

#include "simd_variants.h"

namespace cqk::cpu::CQK_SIMD_VARIANT {

void rms_norm_forward(const float* x, const float* weight, float* y, float* rstd, int64_t rows, int64_t dim,
                      float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    const float* xr = x + row * dim;
    float* yr = y + row * dim;
    float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
    for (int64_t j = 0; j < dim; ++j) squares += xr[j] * xr[j];
    const float r = 1.0f / sqrtf(squares / static_cast<float>(dim) + eps);
    rstd[row] = r;
#pragma omp simd
    for (int64_t j = 0; j < dim; ++j) yr[j] = xr[j] * r * weight[j];
  }
}

// y = x r w with r = (mean(x^2) + eps)^(-1/2), so dr/dx = -r^3 x / dim and
// grad_x = r grad_y w - (r^3 / dim) x sum(grad_y w x); grad_w = sum over rows of grad_y x r.
void rms_norm_backward(const float* x, const float* weight, const float* rstd, const float* grad_y, float* grad_x,
                       float* grad_weight, int64_t rows, int64_t dim) {
#pragma omp parallel
  {
    // This thread's rows' share of grad_weight, added to it at the end.
    float* partial = static_cast<float*>(calloc(static_cast<size_t>(dim), sizeof(float)));
#pragma omp for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const float* xr = x + row * dim;
      const float* gr = grad_y + row * dim;
      float* gxr = grad_x + row * dim;
      const float r = rstd[row];
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < dim; ++j) dot += gr[j] * weight[j] * xr[j];
      const float c = r * r * r * dot / static_cast<float>(dim);
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) {
        gxr[j] = r * gr[j] * weight[j] - c * xr[j];
        partial[j] += gr[j] * xr[j] * r;
      }
    }
#pragma omp critical(cqk_cpu_rms_norm_weight_gradient)
    for (int64_t j = 0; j < dim; ++j) grad_weight[j] += partial[j];
    free(partial);
  }
}

}  // namespace cqk::cpu::CQK_SIMD_VARIANT
