#pragma once
// silu(gate) * up and its backward on float32 arrays, one pass each, with the
// widest compiled copy this CPU runs (as affine_coupling_cpu.h; raw pointers,
// no torch headers). The torch side is include/cqk/swiglu.h.
#include <cstdint>

namespace cqk::cpu {

// Whether a compiled copy runs on this machine (x86-64 with AVX2 and FMA).
bool swiglu_supported();

// out = silu(gate) * up over n contiguous elements. Uses torch's OpenMP threads.
void swiglu_forward(const float* gate, const float* up, float* out, int64_t n);

// grad_gate = grad_out * up * silu'(gate), grad_up = grad_out * silu(gate).
void swiglu_backward(const float* gate, const float* up, const float* grad_out, float* grad_gate, float* grad_up,
                     int64_t n);

}  // namespace cqk::cpu
