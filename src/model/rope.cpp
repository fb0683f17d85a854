#include "cqk/rope.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "cqk/runtime.h"
#include "ops/kernel_arguments.h"
#include "simd/rope_cpu.h"
#ifdef CQK_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>

#include "rope_kernels.h"  // kernels/
#endif

namespace cqk {

namespace {

ProcessSwitch& enabled_switch() {
  static ProcessSwitch on("CQK_FUSED_ROPE", /*default_on=*/true);
  return on;
}

bool rows_readable(const at::Tensor& x) { return x.dim() == 4 && (x.size(3) == 1 || x.stride(3) == 1); }

// A one-pass kernel: float32 on an AVX2 CPU, float32 or bf16 on CUDA.
bool kernel_applies(const at::Tensor& x) {
  if (!fused_rope_enabled() || !rows_readable(x)) return false;
  if (x.device().is_cpu()) return cpu::rope_supported() && x.scalar_type() == at::kFloat;
#ifdef CQK_WITH_CUDA
  return x.is_cuda() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16);
#else
  return false;
#endif
}

kernels::CouplingShape shape_of(const at::Tensor& x) { return {x.size(0), x.size(1), x.size(2), x.size(3), 0}; }

// A contiguous tensor like x, rotated by the tables' angles (negated: `inverse`).
at::Tensor rotated(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool inverse) {
  auto y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
#ifdef CQK_WITH_CUDA
  if (x.is_cuda()) {
    const c10::cuda::CUDAGuard guard(x.device());  // the launch goes to the current device
    kernels::rope_rotate_cuda(kernel_arguments::element_type(x, "rope"), shape_of(x), x.data_ptr(),
                              kernel_arguments::row_strides(x), cos.data_ptr<float>(), sin.data_ptr<float>(),
                              inverse, y.data_ptr(), kernel_arguments::current_stream(x));
    return y;
  }
#endif
  cpu::rope_rotate(shape_of(x), x.data_ptr<float>(), kernel_arguments::row_strides(x), cos.data_ptr<float>(),
                   sin.data_ptr<float>(), inverse, y.data_ptr<float>());
  return y;
}

// The rotation is orthogonal: its backward is the rotation by the negated angles.
struct RopeFunction : public torch::autograd::Function<RopeFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return rotated(x, cos, sin, /*inverse=*/false);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {rotated(grads[0].contiguous(), saved[0], saved[1], /*inverse=*/true), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool fused_rope_enabled() { return enabled_switch().on(); }
void set_fused_rope_enabled(bool enabled) { enabled_switch().set(enabled); }

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
  if (kernel_applies(x)) {
    const auto [cos, sin] = rope_tables(time, dim, base, x.device(), position_offset);
    return RopeFunction::apply(x, cos, sin);
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
