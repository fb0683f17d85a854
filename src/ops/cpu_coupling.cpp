#include "ops/cpu_coupling.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <optional>
#include <utility>
#include <vector>

#include "ops/coupling_autograd.h"
#include "cqk/coupling.h"
#include "ops/cuda_coupling.h"
#include "cqk/rope.h"
#include "ops/kernel_arguments.h"
#include "simd/affine_coupling_cpu.h"

namespace cqk {

namespace {

namespace args = cqk::kernel_arguments;
constexpr const char* kWho = "cpu coupling";

struct CpuAffineCoupling : public torch::autograd::Function<CpuAffineCoupling> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, const CouplingOptions& options,
                                                at::TensorList weights, std::optional<double> rope_base) {
    const std::vector<at::Tensor> w(weights.begin(), weights.end());
    auto q_out = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
    auto k_out = at::empty_like(q_out);
    std::pair<at::Tensor, at::Tensor> rope;
    if (rope_base) rope = rope_tables(q.size(2), q.size(3), *rope_base, q.device());
    cpu::affine_coupling_forward(args::shape_of(options, q), args::coupling_params(options, w, q.device(), kWho),
                                 q.data_ptr<float>(), args::row_strides(q), k.data_ptr<float>(),
                                 args::row_strides(k), q_out.data_ptr<float>(), k_out.data_ptr<float>(),
                                 args::rope_tables(rope.first, rope.second, q.size(2), q.size(3), q.device(), kWho));
    save_rope_tables(ctx, rope.first, rope.second);
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
    for (const auto& w : weights) weight_grads.push_back(at::zeros_like(w));
    const auto [cos, sin] = saved_rope_tables(ctx);
    cpu::affine_coupling_backward(args::shape_of(options, q_out),
                                  args::coupling_params(options, weights, q_out.device(), kWho),
                                  q_out.data_ptr<float>(), k_out.data_ptr<float>(), grad_q_out.data_ptr<float>(),
                                  grad_k_out.data_ptr<float>(), grad_q.data_ptr<float>(), grad_k.data_ptr<float>(),
                                  args::coupling_grads(weights, weight_grads, q_out.device(), kWho),
                                  args::rope_tables(cos, sin, q_out.size(2), q_out.size(3), q_out.device(), kWho));
    torch::autograd::variable_list result{grad_q, grad_k, at::Tensor()};
    result.insert(result.end(), weight_grads.begin(), weight_grads.end());
    result.emplace_back();  // rope_base
    return result;
  }
};

}  // namespace

bool cpu_affine_coupling_applies(const QKCouplingImpl& coupling, const at::Tensor& q, const at::Tensor& k) {
  const auto& options = coupling.options();
  if (!fused_coupling_enabled() || options.kind() != CouplingKind::Affine || !options.recompute_from_inverse())
    return false;
  if (!q.device().is_cpu() || q.scalar_type() != at::kFloat || !k.device().is_cpu() ||
      k.scalar_type() != at::kFloat || q.sizes() != k.sizes() || q.stride(3) != 1 || k.stride(3) != 1)
    return false;
  for (const auto& w : coupling.parameters())
    if (!w.device().is_cpu() || w.scalar_type() != at::kFloat || !w.is_contiguous()) return false;
  return cpu::affine_coupling_supported(args::shape_of(options, q), options.steps(),
                                        static_cast<float>(options.clamp()));
}

std::pair<at::Tensor, at::Tensor> cpu_affine_coupling(const QKCouplingImpl& coupling, const at::Tensor& q,
                                                      const at::Tensor& k, std::optional<double> rope_base) {
  const auto weights = fused::affine_weights(coupling);
  auto outputs = CpuAffineCoupling::apply(q, k, coupling.options(), at::TensorList(weights), rope_base);
  return {outputs[0], outputs[1]};
}

}  // namespace cqk
