#include "cpu_coupling.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <vector>

#include "coupling_autograd.h"
#include "cqk/coupling.h"
#include "cqk/fused_coupling.h"
#include "simd/affine_coupling_cpu.h"

namespace cqk {

namespace {

cpu::AffineCouplingShape kernel_shape(const CouplingOptions& options, const at::Tensor& q) {
  cpu::AffineCouplingShape s;
  s.batch = q.size(0);
  s.heads = q.size(1);
  s.time = q.size(2);
  s.head_dim = q.size(3);
  s.hidden = options.hidden();
  s.steps = options.steps();
  s.groups = options.shared_across_heads() ? 1 : options.num_heads();
  s.clamp = static_cast<float>(options.clamp());
  return s;
}

// weights: per step w1, b1, w2, b2 (fused::affine_weights' order).
std::vector<cpu::AffineStepWeights> step_weights(const std::vector<at::Tensor>& weights) {
  std::vector<cpu::AffineStepWeights> steps;
  for (size_t i = 0; i + 3 < weights.size(); i += 4)
    steps.push_back({weights[i].data_ptr<float>(), weights[i + 1].data_ptr<float>(), weights[i + 2].data_ptr<float>(),
                     weights[i + 3].data_ptr<float>()});
  return steps;
}

struct CpuAffineCoupling : public torch::autograd::Function<CpuAffineCoupling> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, const CouplingOptions& options,
                                                at::TensorList weights) {
    const std::vector<at::Tensor> w(weights.begin(), weights.end());
    auto q_out = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
    auto k_out = at::empty_like(q_out);
    const auto steps = step_weights(w);
    const cpu::TokenStrides strides{q.stride(0), q.stride(1), q.stride(2)};
    cpu::affine_coupling_forward(kernel_shape(options, q), steps.data(), q.data_ptr<float>(), k.data_ptr<float>(),
                                 strides, q_out.data_ptr<float>(), k_out.data_ptr<float>());
    save_coupling_options(ctx, options);
    std::vector<at::Tensor> saved{q_out, k_out};
    saved.insert(saved.end(), w.begin(), w.end());
    ctx->save_for_backward(saved);
    return {q_out, k_out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto options = saved_coupling_options(ctx);
    const auto saved = ctx->get_saved_variables();
    const auto &q_out = saved[0], &k_out = saved[1];
    const std::vector<at::Tensor> weights(saved.begin() + 2, saved.end());
    const auto grad_or_zero = [&](const at::Tensor& g) { return g.defined() ? g.contiguous() : at::zeros_like(q_out); };
    const auto grad_q_out = grad_or_zero(grads[0]), grad_k_out = grad_or_zero(grads[1]);
    auto grad_q = at::empty_like(q_out), grad_k = at::empty_like(k_out);
    std::vector<at::Tensor> weight_grads;
    std::vector<cpu::AffineStepGradients> step_grads;
    for (const auto& w : weights) weight_grads.push_back(at::zeros_like(w));
    for (size_t i = 0; i + 3 < weight_grads.size(); i += 4)
      step_grads.push_back({weight_grads[i].data_ptr<float>(), weight_grads[i + 1].data_ptr<float>(),
                            weight_grads[i + 2].data_ptr<float>(), weight_grads[i + 3].data_ptr<float>()});
    const auto steps = step_weights(weights);
    cpu::affine_coupling_backward(kernel_shape(options, q_out), steps.data(), q_out.data_ptr<float>(),
                                  k_out.data_ptr<float>(), grad_q_out.data_ptr<float>(),
                                  grad_k_out.data_ptr<float>(), grad_q.data_ptr<float>(), grad_k.data_ptr<float>(),
                                  step_grads.data());
    torch::autograd::variable_list result{grad_q, grad_k, at::Tensor()};
    result.insert(result.end(), weight_grads.begin(), weight_grads.end());
    return result;
  }
};

}  // namespace

bool cpu_affine_coupling_applies(const QKCouplingImpl& coupling, const at::Tensor& q, const at::Tensor& k) {
  const auto& options = coupling.options();
  if (!fused_coupling_enabled() || options.kind() != CouplingKind::Affine || !options.recompute_from_inverse())
    return false;
  if (!q.device().is_cpu() || q.scalar_type() != at::kFloat || !k.device().is_cpu() ||
      k.scalar_type() != at::kFloat || q.sizes() != k.sizes() || q.strides() != k.strides() || q.stride(3) != 1)
    return false;
  for (const auto& w : coupling.parameters())
    if (!w.device().is_cpu() || w.scalar_type() != at::kFloat || !w.is_contiguous()) return false;
  return cpu::affine_coupling_supported(kernel_shape(options, q));
}

std::pair<at::Tensor, at::Tensor> cpu_affine_coupling(const QKCouplingImpl& coupling, const at::Tensor& q,
                                                      const at::Tensor& k) {
  const auto weights = fused::affine_weights(coupling);
  auto outputs = CpuAffineCoupling::apply(q, k, coupling.options(), at::TensorList(weights));
  return {outputs[0], outputs[1]};
}

}  // namespace cqk
