#include "ops/recompute_from_inverse.h"

#include <torch/autograd.h>

#include "cqk/coupling.h"

namespace cqk::ops {

namespace {

struct RecomputeFromInverse : public torch::autograd::Function<RecomputeFromInverse> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, QKCouplingImpl* coupling,
                                                at::TensorList params) {
    auto [q_out, k_out] = coupling->transform(q, k);
    // The module outlives the backward pass of any graph built through it.
    ctx->saved_data["coupling"] = reinterpret_cast<int64_t>(coupling);
    ctx->saved_data["num_params"] = static_cast<int64_t>(params.size());
    ctx->save_for_backward({q_out, k_out});
    return {q_out, k_out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* coupling = reinterpret_cast<QKCouplingImpl*>(ctx->saved_data["coupling"].toInt());
    const auto saved = ctx->get_saved_variables();
    at::Tensor q, k;
    {
      at::NoGradGuard no_grad;
      std::tie(q, k) = coupling->inverse_transform(saved[0], saved[1]);
    }
    q = q.detach().requires_grad_(true);
    k = k.detach().requires_grad_(true);
    torch::autograd::variable_list inputs{q, k};
    for (const auto& p : coupling->parameters()) inputs.push_back(p);
    at::AutoGradMode enable_grad(true);
    auto [q_out, k_out] = coupling->transform(q, k);
    const auto grad_or_zero = [](const at::Tensor& g, const at::Tensor& like) {
      return g.defined() ? g : at::zeros_like(like);
    };
    auto input_grads = torch::autograd::grad({q_out, k_out}, inputs,
                                             {grad_or_zero(grads[0], q_out), grad_or_zero(grads[1], k_out)},
                                             /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
    torch::autograd::variable_list result{input_grads[0], input_grads[1], at::Tensor()};
    result.insert(result.end(), input_grads.begin() + 2, input_grads.end());
    return result;
  }
};

}  // namespace

std::pair<at::Tensor, at::Tensor> recompute_from_inverse(QKCouplingImpl& coupling, const at::Tensor& q,
                                                         const at::Tensor& k) {
  const auto params = coupling.parameters();
  // As a TensorList, each parameter counts as an input of the autograd node.
  auto outputs = RecomputeFromInverse::apply(q, k, &coupling, at::TensorList(params));
  return {outputs[0], outputs[1]};
}

}  // namespace cqk::ops
