#pragma once
// RMSNorm's one-pass CPU kernels (src/simd/rms_norm_cpu.h) as a torch autograd
// function, and when they apply. cqk::RMSNormImpl (src/model/rms_norm.cpp)
// takes them where they apply and the ATen ops elsewhere. Internal to the library.
#include <ATen/core/Tensor.h>

namespace cqk::ops {

// The switch is on, x and weight are float32 CPU tensors, x's last dimension
// is weight's size, and the CPU has AVX2 and FMA.
bool rms_norm_kernel_applies(const at::Tensor& x, const at::Tensor& weight);

// RMSNorm of x's rows with `weight`, differentiable with respect to both;
// saves x, the weight and one float per row (1 / rms).
at::Tensor rms_norm_kernel(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace cqk::ops
