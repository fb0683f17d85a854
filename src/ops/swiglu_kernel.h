#pragma once
// SwiGLU's one-pass CPU kernel (src/simd/swiglu_cpu.h) as a torch autograd
// function, and when it applies. cqk::swiglu (src/model/swiglu.cpp) takes it
// where it applies and at::silu(gate) * up elsewhere. Internal to the library.
#include <ATen/core/Tensor.h>

namespace cqk::ops {

// The switch is on, gate and up are float32 CPU tensors of one shape, and the
// CPU has AVX2 and FMA.
bool swiglu_kernel_applies(const at::Tensor& gate, const at::Tensor& up);

// silu(gate) * up, differentiable with respect to both; saves only its inputs.
at::Tensor swiglu_kernel(const at::Tensor& gate, const at::Tensor& up);

}  // namespace cqk::ops
