// RoPE's rotation in one pass, compiled once per instruction set like
// affine_coupling_cpu.cpp (see src/simd/CMakeLists.txt). ATen runs it as a
// negation, two concatenations, two products and a sum, and as much again
// in the backward.
#include "simd_variants.h"

namespace cqk::cpu::CQK_SIMD_VARIANT {

void rope_rotate(const kernels::CouplingShape& shape, const float* x, const kernels::RowStrides& strides,
                 const float* cos, const float* sin, bool inverse, float* y) {
  const int64_t half = shape.head_dim / 2, rows = shape.batch * shape.heads * shape.time;
  const float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t b = row / (shape.heads * shape.time), h = (row / shape.time) % shape.heads, t = row % shape.time;
    const float* xr = x + b * strides.batch + h * strides.head + t * strides.time;
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    float* yr = y + row * shape.head_dim;
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float first = xr[i], second = xr[i + half], si = sign * s[i];
      yr[i] = first * c[i] - second * si;
      yr[i + half] = second * c[i] + first * si;
    }
  }
}

}  // namespace cqk::cpu::CQK_SIMD_VARIANT
