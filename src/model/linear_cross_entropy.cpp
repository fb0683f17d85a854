#include "cqk/linear_cross_entropy.h"

#include <torch/autograd.h>

#include <limits>
#include <stdexcept>
#include <string>

namespace cqk {

namespace {

void check_inputs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets) {
  if (hidden.dim() != 2 || weight.dim() != 2 || hidden.size(1) != weight.size(1))
    throw std::invalid_argument("linear_cross_entropy: hidden must be [N, d] and weight [V, d], got " +
                                c10::str(hidden.sizes()) + " and " + c10::str(weight.sizes()));
  if (targets.dim() != 1 || targets.size(0) != hidden.size(0) || targets.scalar_type() != at::kLong)
    throw std::invalid_argument("linear_cross_entropy: targets must be int64 [" + std::to_string(hidden.size(0)) +
                                "], got " + std::string(c10::toString(targets.scalar_type())) + " " +
                                c10::str(targets.sizes()));
}

struct LinearCrossEntropy : public torch::autograd::Function<LinearCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& weight, const at::Tensor& targets, int64_t ignore_index) {
    // Autocast stays active inside an autograd function's forward, so this
    // matmul runs in the same type as the unfused head's.
    const auto logits = at::matmul(hidden, weight.t());
    auto gradient = logits.to(at::kFloat);  // a fresh tensor unless the logits are float32 already
    const auto valid = targets.ne(ignore_index);
    const auto safe_targets = targets.masked_fill(~valid, 0).unsqueeze(1);
    const auto target_logits = gradient.gather(1, safe_targets).squeeze(1);
    const auto row_max = std::get<0>(gradient.max(1, /*keepdim=*/true));
    gradient.sub_(row_max).exp_();
    const auto row_sum = gradient.sum(1, /*keepdim=*/true);
    // log(sum exp(x - max)) + max - x_target: no exp of the target logit can underflow here.
    const auto row_loss = row_sum.log().squeeze(1) + row_max.squeeze(1) - target_logits;
    const auto valid_float = valid.to(at::kFloat);
    const auto count = valid_float.sum();
    const auto loss = (row_loss * valid_float).sum() / count;

    // softmax - one_hot; an ignored row divides by infinity, so its gradient is 0
    // without another pass (or a device sync to ask whether any row is ignored).
    gradient.div_(at::where(valid.unsqueeze(1), row_sum, std::numeric_limits<float>::infinity()));
    gradient.scatter_add_(1, safe_targets, -valid_float.unsqueeze(1));
    ctx->save_for_backward({hidden, weight, gradient, count});
    ctx->saved_data["logits_type"] = static_cast<int64_t>(logits.scalar_type());
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto &hidden = saved[0], &weight = saved[1], &gradient = saved[2], &count = saved[3];
    const auto type = static_cast<at::ScalarType>(ctx->saved_data["logits_type"].toInt());
    const auto scale = grad_outputs[0] / count;
    // The [N, V] gradient is consumed as it is (cast only under autocast); the scale goes on the small results.
    const auto grad_logits = gradient.to(type);
    const auto grad_hidden = at::matmul(grad_logits, weight.to(type)).mul_(scale).to(hidden.scalar_type());
    const auto grad_weight = at::matmul(grad_logits.t(), hidden.to(type)).mul_(scale).to(weight.scalar_type());
    return {grad_hidden, grad_weight, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                int64_t ignore_index) {
  check_inputs(hidden, weight, targets);
  return LinearCrossEntropy::apply(hidden, weight, targets, ignore_index);
}

}  // namespace cqk
