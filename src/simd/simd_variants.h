#pragma once
// The compiled copies of the CPU kernels (the coupling, SwiGLU, RMSNorm, RoPE), one namespace per
// instruction set (affine_coupling_cpu.cpp is compiled once for each), and
// the limits every copy shares. Internal to src/simd/.
#include "affine_coupling_cpu.h"
#include "rms_norm_cpu.h"
#include "rope_cpu.h"
#include "swiglu_cpu.h"

namespace cqk::cpu {

constexpr int64_t kMaxHeadDim = 256;
// exp of at most this is finite in float32 (the limit is 88.7).
constexpr float kMaxExponent = 80.0f;

#define CQK_DECLARE_SIMD_VARIANT(name)                                                                          \
  namespace name {                                                                                             \
  void forward(const kernels::CouplingShape& shape, const kernels::AffineCouplingParams& params, const float* q, \
               const kernels::RowStrides& q_strides, const float* k, const kernels::RowStrides& k_strides,     \
               float* q_out, float* k_out, const kernels::RopeTables& rope);                                   \
  void backward(const kernels::CouplingShape& shape, const kernels::AffineCouplingParams& params,              \
                const float* q_out, const float* k_out, const float* grad_q_out, const float* grad_k_out,      \
                float* grad_q, float* grad_k, const kernels::AffineCouplingGrads& grads,                       \
                const kernels::RopeTables& rope);                                                              \
  void swiglu_forward(const float* gate, const float* up, float* out, int64_t n);                             \
  void swiglu_backward(const float* gate, const float* up, const float* grad_out, float* grad_gate,          \
                       float* grad_up, int64_t n);                                                             \
  void rms_norm_forward(const float* x, const float* weight, float* y, float* rstd, int64_t rows, int64_t dim, \
                        float eps);                                                                            \
  void rms_norm_backward(const float* x, const float* weight, const float* rstd, const float* grad_y,         \
                         float* grad_x, float* grad_weight, int64_t rows, int64_t dim);                        \
  void rope_rotate(const kernels::CouplingShape& shape, const float* x, const kernels::RowStrides& strides,    \
                   const float* cos, const float* sin, bool inverse, float* y);                                \
  }

CQK_DECLARE_SIMD_VARIANT(avx2)    // AVX2 and FMA: 8 floats per vector
CQK_DECLARE_SIMD_VARIANT(avx512)  // AVX-512 F/DQ/VL: 16 floats per vector

#undef CQK_DECLARE_SIMD_VARIANT

// The copy this process runs: "avx512" or "avx2" by what the CPU supports, or
// "none" (then the ATen path runs). CQK_CPU_KERNEL=avx2 makes an AVX-512
// machine run the AVX2 copy (for comparing and testing both); a value other
// than avx512 or avx2, or a copy the CPU cannot run, throws
// std::invalid_argument (on every call: the choice is made once it succeeds).
const char* simd_variant();

}  // namespace cqk::cpu
