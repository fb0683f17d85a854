#include "cqk/rms_norm.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "cqk/runtime.h"
#include "simd/rms_norm_cpu.h"

namespace cqk {

namespace {

ProcessSwitch& enabled_switch() {
  static ProcessSwitch on("CQK_FUSED_RMS_NORM", /*default_on=*/true);
  return on;
}

bool kernel_applies(const at::Tensor& x, const at::Tensor& weight) {
  const auto cpu_float = [](const at::Tensor& t) { return t.device().is_cpu() && t.scalar_type() == at::kFloat; };
  return fused_rms_norm_enabled() && cpu::rms_norm_supported() && cpu_float(x) && cpu_float(weight) &&
         x.dim() >= 1 && weight.numel() > 0 && x.size(-1) == weight.numel();
}

// Saves x, the weight and one float per row (1 / rms), not the normalised rows.
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

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) const {
  if (kernel_applies(x, weight)) return RMSNormFunction::apply(x, weight, eps_);
  // Statistics in float32 at least, so bf16 activations normalise accurately.
  const auto compute_type = at::promote_types(x.scalar_type(), at::kFloat);
  const auto xf = x.to(compute_type);
  const auto normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return (normed * weight).to(x.scalar_type());
}

}  // namespace cqk
