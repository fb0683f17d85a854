#include "ops/rope_kernel.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "cqk/rope.h"
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

namespace ops {

bool rope_kernel_applies(const at::Tensor& x) {
  if (!fused_rope_enabled() || !rows_readable(x)) return false;
  if (x.device().is_cpu()) return cpu::rope_supported() && x.scalar_type() == at::kFloat;
#ifdef CQK_WITH_CUDA
  return x.is_cuda() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16);
#else
  return false;
#endif
}

at::Tensor rope_kernel(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return RopeFunction::apply(x, cos, sin);
}

}  // namespace ops

}  // namespace cqk
