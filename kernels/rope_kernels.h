#pragma once
// Host launcher for RoPE alone on the GPU (rope_kernels.cu): the base model's
// rotation in one pass per tensor, as the fused coupling kernel applies it to a
// coupled model's q and k, so that coupled/base timings compare the coupling
// alone. Raw pointers only; the torch side is apply_rope (src/model/rope.cpp).
#include "coupling_kernels.h"  // CouplingShape, RowStrides, ElementType

namespace cqk::kernels {

// y (contiguous, x's element type) = x rotated by the angles whose cosines and
// sines are cos, sin ([time, head_dim / 2] contiguous float32 on the device),
// the math in float32: for i < head_dim / 2,
//   y_i = x_i cos - x_{i+half} sin,  y_{i+half} = x_{i+half} cos + x_i sin.
// `inverse` rotates by the negated angles (the backward). x's rows are
// `strides` apart with head_dim contiguous; shape.hidden is unused. Throws
// std::invalid_argument for an odd head_dim, std::runtime_error for a CUDA error.
void rope_rotate_cuda(ElementType type, const CouplingShape& shape, const void* x, const RowStrides& strides,
                      const float* cos, const float* sin, bool inverse, void* y, void* stream);

}  // namespace cqk::kernels
