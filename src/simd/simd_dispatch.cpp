// Run-time choice between the compiled copies of the CPU kernels.
// Compiled with the default flags: this code runs on any x86-64.
#include <stdlib.h>

#include <stdexcept>
#include <string>

#include "simd_variants.h"

namespace cqk::cpu {

namespace {

enum class Variant { None, Avx2, Avx512 };  // ordered: a CPU that runs one runs those before it

const char* name_of(Variant v) {
  switch (v) {
    case Variant::Avx512: return "avx512";
    case Variant::Avx2: return "avx2";
    default: return "none";
  }
}

Variant widest_supported() {
#if defined(__x86_64__)
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl");
  return avx512 ? Variant::Avx512 : avx2 ? Variant::Avx2 : Variant::None;
#else
  return Variant::None;
#endif
}

// The widest copy the CPU runs, or the one $CQK_CPU_KERNEL names.
Variant detect() {
  const Variant widest = widest_supported();
  const char* forced = getenv("CQK_CPU_KERNEL");
  if (forced == nullptr || *forced == '\0') return widest;
  const std::string name = forced;
  if (name != "avx512" && name != "avx2")
    throw std::invalid_argument("CQK_CPU_KERNEL must be avx512 or avx2, got '" + name + "'");
  const Variant wanted = name == "avx512" ? Variant::Avx512 : Variant::Avx2;
  if (wanted > widest)
    throw std::invalid_argument("CQK_CPU_KERNEL=" + name + ", but this CPU runs at most " + name_of(widest));
  return wanted;
}

Variant variant() {
  static const Variant chosen = detect();
  return chosen;
}

}  // namespace

const char* simd_variant() { return name_of(variant()); }

bool affine_coupling_supported(const kernels::CouplingShape& s, int64_t steps, float clamp) {
  return variant() != Variant::None && (s.hidden == 8 || s.hidden == 16) && s.head_dim % 8 == 0 &&
         s.head_dim > 0 && s.head_dim <= kMaxHeadDim && steps >= 1 &&
         steps <= kernels::AffineCouplingParams::kMaxSteps && clamp > 0 &&
         clamp <= kMaxExponent;  // |s| <= clamp: exp(s) and exp(-s) stay finite
}

void affine_coupling_forward(const kernels::CouplingShape& s, const kernels::AffineCouplingParams& p, const float* q,
                             const kernels::RowStrides& q_strides, const float* k,
                             const kernels::RowStrides& k_strides, float* q_out, float* k_out,
                             const kernels::RopeTables& rope) {
#if defined(__x86_64__)  // elsewhere no copy is compiled, and affine_coupling_supported() is false
  if (variant() == Variant::Avx512) avx512::forward(s, p, q, q_strides, k, k_strides, q_out, k_out, rope);
  else avx2::forward(s, p, q, q_strides, k, k_strides, q_out, k_out, rope);
#endif
}

void affine_coupling_backward(const kernels::CouplingShape& s, const kernels::AffineCouplingParams& p,
                              const float* q_out, const float* k_out, const float* grad_q_out,
                              const float* grad_k_out, float* grad_q, float* grad_k,
                              const kernels::AffineCouplingGrads& grads, const kernels::RopeTables& rope) {
#if defined(__x86_64__)
  if (variant() == Variant::Avx512)
    avx512::backward(s, p, q_out, k_out, grad_q_out, grad_k_out, grad_q, grad_k, grads, rope);
  else
    avx2::backward(s, p, q_out, k_out, grad_q_out, grad_k_out, grad_q, grad_k, grads, rope);
#endif
}

bool swiglu_supported() { return variant() != Variant::None; }

void swiglu_forward(const float* gate, const float* up, float* out, int64_t n) {
#if defined(__x86_64__)
  if (variant() == Variant::Avx512) avx512::swiglu_forward(gate, up, out, n);
  else avx2::swiglu_forward(gate, up, out, n);
#endif
}

void swiglu_backward(const float* gate, const float* up, const float* grad_out, float* grad_gate, float* grad_up,
                     int64_t n) {
#if defined(__x86_64__)
  if (variant() == Variant::Avx512) avx512::swiglu_backward(gate, up, grad_out, grad_gate, grad_up, n);
  else avx2::swiglu_backward(gate, up, grad_out, grad_gate, grad_up, n);
#endif
}

bool rms_norm_supported() { return variant() != Variant::None; }

void rms_norm_forward(const float* x, const float* weight, float* y, float* rstd, int64_t rows, int64_t dim,
                      float eps) {
#if defined(__x86_64__)
  if (variant() == Variant::Avx512) avx512::rms_norm_forward(x, weight, y, rstd, rows, dim, eps);
  else avx2::rms_norm_forward(x, weight, y, rstd, rows, dim, eps);
#endif
}

void rms_norm_backward(const float* x, const float* weight, const float* rstd, const float* grad_y, float* grad_x,
                       float* grad_weight, int64_t rows, int64_t dim) {
#if defined(__x86_64__)
  if (variant() == Variant::Avx512) avx512::rms_norm_backward(x, weight, rstd, grad_y, grad_x, grad_weight, rows, dim);
  else avx2::rms_norm_backward(x, weight, rstd, grad_y, grad_x, grad_weight, rows, dim);
#endif
}

bool rope_supported() { return variant() != Variant::None; }

void rope_rotate(const kernels::CouplingShape& shape, const float* x, const kernels::RowStrides& strides,
                 const float* cos, const float* sin, bool inverse, float* y) {
#if defined(__x86_64__)
  if (variant() == Variant::Avx512) avx512::rope_rotate(shape, x, strides, cos, sin, inverse, y);
  else avx2::rope_rotate(shape, x, strides, cos, sin, inverse, y);
#endif
}

}  // namespace cqk::cpu
