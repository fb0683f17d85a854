#pragma once
// RMSNorm over the rows of a float32 [rows, dim] array and its backward, one
// pass each, with the widest compiled copy this CPU runs (as
// affine_coupling_cpu.h; raw pointers, no torch headers). The torch side is
// RMSNormImpl (include/cqk/rms_norm.h).
#include <cstdint>

namespace cqk::cpu {

// Whether a compiled copy runs on this machine (x86-64 with AVX2 and FMA).
bool rms_norm_supported();

// y = x * rstd * weight per row, rstd[row] = 1 / sqrt(mean(x^2) + eps). All contiguous.
void rms_norm_forward(const float* x, const float* weight, float* y, float* rstd, int64_t rows, int64_t dim,
                      float eps);

// From x, weight, the forward's rstd and grad_y: grad_x (written) and
// grad_weight (ADDED to). Uses torch's OpenMP threads.
void rms_norm_backward(const float* x, const float* weight, const float* rstd, const float* grad_y, float* grad_x,
                       float* grad_weight, int64_t rows, int64_t dim);

}  // namespace cqk::cpu
