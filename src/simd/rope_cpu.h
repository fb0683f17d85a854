#pragma once
// RoPE's rotate-half rotation of float32 [batch, heads, time, head_dim] rows
// in one pass, with the widest compiled copy this CPU runs (as
// affine_coupling_cpu.h; raw pointers, no torch headers). The torch side is
// apply_rope (include/cqk/rope.h).
#include "coupling_kernels.h"  // kernels/: CouplingShape, RowStrides

namespace cqk::cpu {

// Whether a compiled copy runs on this machine (x86-64 with AVX2 and FMA).
bool rope_supported();

// y (contiguous) = x rotated by the angles whose cosines and sines are
// cos, sin ([time, head_dim / 2], contiguous): for i < head_dim / 2,
// y_i = x_i cos - x_{i+half} sin, y_{i+half} = x_{i+half} cos + x_i sin.
// `inverse` rotates by the negated angles, which is the backward. shape.hidden
// is unused; x's rows are `strides` apart. Uses torch's OpenMP threads.
void rope_rotate(const kernels::CouplingShape& shape, const float* x, const kernels::RowStrides& strides,
                 const float* cos, const float* sin, bool inverse, float* y);

}  // namespace cqk::cpu
