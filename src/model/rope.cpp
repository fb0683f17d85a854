#include "cqk/rope.h"

#include <ATen/ATen.h>

#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "ops/rope_kernel.h"

namespace cqk {

at::Tensor rope_angles(int64_t time, int64_t head_dim, double base, int64_t position_offset, const at::Device& device) {
  const auto opts = at::TensorOptions().dtype(at::kDouble).device(device);
  const auto inv_freq = at::pow(base, -at::arange(0, head_dim / 2, opts) * (2.0 / static_cast<double>(head_dim)));
  return at::outer(at::arange(position_offset, position_offset + time, opts), inv_freq);
}

std::pair<at::Tensor, at::Tensor> rope_tables(int64_t time, int64_t head_dim, double base, const at::Device& device,
                                              int64_t position_offset) {
  // Every attention call of a step asks for the same tables (q and k, every
  // layer): building them is a handful of small kernels each time.
  using Key = std::tuple<int64_t, int64_t, double, int64_t, std::string>;
  static std::mutex mutex;
  static std::map<Key, std::pair<at::Tensor, at::Tensor>> cache;
  const Key key{time, head_dim, base, position_offset, device.str()};
  std::lock_guard<std::mutex> lock(mutex);
  if (const auto hit = cache.find(key); hit != cache.end()) return hit->second;
  if (cache.size() >= 64) cache.clear();  // lengths vary only in generation and evaluation
  const auto angles = rope_angles(time, head_dim, base, position_offset, device);
  return cache[key] = {angles.cos().to(at::kFloat).contiguous(), angles.sin().to(at::kFloat).contiguous()};
}

at::Tensor apply_rope(const at::Tensor& x, double base, int64_t position_offset) {
  const int64_t time = x.size(-2), dim = x.size(-1), half = dim / 2;
  TORCH_CHECK(dim % 2 == 0, "rope: head_dim must be even, got ", dim);
  if (ops::rope_kernel_applies(x)) {
    const auto [cos, sin] = rope_tables(time, dim, base, x.device(), position_offset);
    return ops::rope_kernel(x, cos, sin);
  }
  const auto angles = rope_angles(time, dim, base, position_offset, x.device());  // [time, half]
  const auto compute = at::promote_types(x.scalar_type(), at::kFloat);
  const auto cos = at::cat({angles.cos(), angles.cos()}, -1).to(compute);
  const auto sin = at::cat({angles.sin(), angles.sin()}, -1).to(compute);
  const auto xf = x.to(compute);
  const auto rotated = at::cat({-xf.narrow(-1, half, half), xf.narrow(-1, 0, half)}, -1);
  return (xf * cos + rotated * sin).to(x.scalar_type());
}

}  // namespace cqk
