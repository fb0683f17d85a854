#include "ops/swiglu_kernel.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "cqk/runtime.h"
#include "cqk/swiglu.h"
#include "simd/swiglu_cpu.h"

namespace cqk {

namespace {

ProcessSwitch& enabled_switch() {
  static ProcessSwitch on("CQK_FUSED_SWIGLU", /*default_on=*/true);
  return on;
}

struct SwiGLUFunction : public torch::autograd::Function<SwiGLUFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    const auto g = gate.contiguous(), u = up.contiguous();
    auto out = at::empty_like(g);
    cpu::swiglu_forward(g.data_ptr<float>(), u.data_ptr<float>(), out.data_ptr<float>(), g.numel());
    ctx->save_for_backward({g, u});
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &gate = saved[0], &up = saved[1];
    const auto grad_out = grads[0].contiguous();
    auto grad_gate = at::empty_like(gate), grad_up = at::empty_like(up);
    cpu::swiglu_backward(gate.data_ptr<float>(), up.data_ptr<float>(), grad_out.data_ptr<float>(),
                         grad_gate.data_ptr<float>(), grad_up.data_ptr<float>(), gate.numel());
    return {grad_gate, grad_up};
  }
};

}  // namespace

bool fused_swiglu_enabled() { return enabled_switch().on(); }
void set_fused_swiglu_enabled(bool enabled) { enabled_switch().set(enabled); }

namespace ops {

bool swiglu_kernel_applies(const at::Tensor& gate, const at::Tensor& up) {
  const auto cpu_float = [](const at::Tensor& t) { return t.device().is_cpu() && t.scalar_type() == at::kFloat; };
  return fused_swiglu_enabled() && cpu::swiglu_supported() && cpu_float(gate) && cpu_float(up) &&
         gate.sizes() == up.sizes();
}

at::Tensor swiglu_kernel(const at::Tensor& gate, const at::Tensor& up) { return SwiGLUFunction::apply(gate, up); }

}  // namespace ops

}  // namespace cqk
