#pragma once
// Rotary position embedding (rotate-half form) over the last dimension.
#include <ATen/core/Tensor.h>

namespace cqk {

// x: [batch, heads, time, head_dim] with an even head_dim; position t of the
// time axis is rotated by angles t * base^(-2i/head_dim), i < head_dim/2.
at::Tensor apply_rope(const at::Tensor& x, double base, int64_t position_offset = 0);

}  // namespace cqk
