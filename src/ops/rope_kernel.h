#pragma once
// RoPE's one-pass kernels (src/simd/rope_cpu.h, kernels/rope_kernels.h) as a
// torch autograd function, and when they apply. cqk::apply_rope
// (src/model/rope.cpp) takes them where they apply and the ATen ops elsewhere.
// Internal to the library.
#include <ATen/core/Tensor.h>

namespace cqk::ops {

// The switch is on, x is [batch, heads, time, head_dim] with its last
// dimension contiguous, and float32 on a CPU with AVX2 and FMA or float32 or
// bf16 on CUDA.
bool rope_kernel_applies(const at::Tensor& x);

// x rotated by the tables' angles (cos, sin: cqk::rope_tables for x's time and
// head dim on x's device), contiguous, differentiable with respect to x.
at::Tensor rope_kernel(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace cqk::ops
