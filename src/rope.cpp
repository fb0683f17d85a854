#include "cqk/rope.h"

#include <ATen/ATen.h>

namespace cqk {

at::Tensor rope_angles(int64_t time, int64_t head_dim, double base, int64_t position_offset, const at::Device& device) {
  const auto opts = at::TensorOptions().dtype(at::kDouble).device(device);
  const auto inv_freq = at::pow(base, -at::arange(0, head_dim / 2, opts) * (2.0 / static_cast<double>(head_dim)));
  return at::outer(at::arange(position_offset, position_offset + time, opts), inv_freq);
}

at::Tensor apply_rope(const at::Tensor& x, double base, int64_t position_offset) {
  const int64_t time = x.size(-2), dim = x.size(-1), half = dim / 2;
  TORCH_CHECK(dim % 2 == 0, "rope: head_dim must be even, got ", dim);
  const auto angles = rope_angles(time, dim, base, position_offset, x.device());  // [time, half]
  const auto compute = at::promote_types(x.scalar_type(), at::kFloat);
  const auto cos = at::cat({angles.cos(), angles.cos()}, -1).to(compute);
  const auto sin = at::cat({angles.sin(), angles.sin()}, -1).to(compute);
  const auto xf = x.to(compute);
  const auto rotated = at::cat({-xf.narrow(-1, half, half), xf.narrow(-1, 0, half)}, -1);
  return (xf * cos + rotated * sin).to(x.scalar_type());
}

}  // namespace cqk
