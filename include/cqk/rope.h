#pragma once
// Rotary position embedding (rotate-half form) over the last dimension.
#include <ATen/core/Tensor.h>

namespace cqk {

// x: [batch, heads, time, head_dim] with an even head_dim; position t of the
// time axis is rotated by angles t * base^(-2i/head_dim), i < head_dim/2.
at::Tensor apply_rope(const at::Tensor& x, double base, int64_t position_offset = 0);

// The rotation angles t * base^(-2i/head_dim) in float64, [time, head_dim / 2],
// for positions position_offset .. position_offset + time - 1 (float64: positions
// times frequencies lose digits in float32 at long lengths). apply_rope and the
// fused attention kernels' tables both come from here.
at::Tensor rope_angles(int64_t time, int64_t head_dim, double base, int64_t position_offset, const at::Device& device);

}  // namespace cqk
