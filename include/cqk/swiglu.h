#pragma once
// SwiGLU's gate: silu(gate) * up, differentiable with respect to both. On
// float32 CPU tensors of one shape it runs the one-pass CPU kernel forward and
// backward (src/simd/swiglu_cpu.h) and saves only its inputs; anywhere else,
// and with CQK_FUSED_SWIGLU=0 or set_fused_swiglu_enabled(false), it is
// at::silu(gate) * up.
#include <ATen/core/Tensor.h>

namespace cqk {

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);

bool fused_swiglu_enabled();
void set_fused_swiglu_enabled(bool enabled);

}  // namespace cqk
