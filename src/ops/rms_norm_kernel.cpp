#include "ops/rms_norm_kernel.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "cqk/rms_norm.h"
#include "cqk/runtime.h"
#include "simd/rms_norm_cpu.h"

namespace cqk {

namespace {

ProcessSwitch& enabled_switch() {
  static ProcessSwitch on("CQK_FUSED_RMS_NORM", /*default_on=*/true);
  return on;
}

struct RMSNormFunction : public torch::autograd::Function<RMSNormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            double eps) {
    const auto xc = x.contiguous(), w = weight.contiguous();
    const int64_t dim = w.numel(), rows = xc.numel() / dim;
    auto y = at::empty_like(xc);
    auto rstd = at::empty({rows}, xc.options());
    cpu::rms_norm_forward(xc.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), rstd.data_ptr<float>(),
                          rows, dim, static_cast<float>(eps));
    ctx->save_for_backward({xc, w, rstd});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1], &rstd = saved[2];
    const auto grad_y = grads[0].contiguous();
    auto grad_x = at::empty_like(x), grad_w = at::zeros_like(w);
    cpu::rms_norm_backward(x.data_ptr<float>(), w.data_ptr<float>(), rstd.data_ptr<float>(),
                           grad_y.data_ptr<float>(), grad_x.data_ptr<float>(), grad_w.data_ptr<float>(), rstd.numel(),
                           w.numel());
    return {grad_x, grad_w, at::Tensor()};
  }
};

}  // namespace

bool fused_rms_norm_enabled() { return enabled_switch().on(); }
void set_fused_rms_norm_enabled(bool enabled) { enabled_switch().set(enabled); }

namespace ops {

bool rms_norm_kernel_applies(const at::Tensor& x, const at::Tensor& weight) {
  const auto cpu_float = [](const at::Tensor& t) { return t.device().is_cpu() && t.scalar_type() == at::kFloat; };
  return fused_rms_norm_enabled() && cpu::rms_norm_supported() && cpu_float(x) && cpu_float(weight) &&
         x.dim() >= 1 && weight.numel() > 0 && x.size(-1) == weight.numel();
}

at::Tensor rms_norm_kernel(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return RMSNormFunction::apply(x, weight, eps);
}

}  // namespace ops

}  // namespace cqk
