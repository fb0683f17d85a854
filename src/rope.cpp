#include "cqk/rope.h"

#include <ATen/ATen.h>

namespace cqk {

at::Tensor apply_rope(const at::Tensor& x, double base, int64_t position_offset) {
  const int64_t time = x.size(-2), dim = x.size(-1), half = dim / 2;
  TORCH_CHECK(dim % 2 == 0, "rope: head_dim must be even, got ", dim);
  // Angles in float64, then cast: positions times frequencies lose digits in float32 at long lengths.
  const auto opts = at::TensorOptions().dtype(at::kDouble).device(x.device());
  const auto inv_freq = at::pow(base, -at::arange(0, half, opts) * (2.0 / static_cast<double>(dim)));
  const auto positions = at::arange(position_offset, position_offset + time, opts);
  const auto angles = at::outer(positions, inv_freq);  // [time, half]
  const auto compute = at::promote_types(x.scalar_type(), at::kFloat);
  const auto cos = at::cat({angles.cos(), angles.cos()}, -1).to(compute);
  const auto sin = at::cat({angles.sin(), angles.sin()}, -1).to(compute);
  const auto xf = x.to(compute);
  const auto rotated = at::cat({-xf.narrow(-1, half, half), xf.narrow(-1, 0, half)}, -1);
  return (xf * cos + rotated * sin).to(x.scalar_type());
}

}  // namespace cqk
