#include "cqk/fused_adamw.h"

#include <ATen/ops/_fused_adamw.h>

#include <map>
#include <tuple>
#include <utility>

namespace cqk {

namespace {

// One call of the fused kernel: tensors of one device and dtype, and the step
// count each parameter's bias correction uses.
struct FusedBatch {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
};

}  // namespace

FusedAdamW::FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::AdamWOptions defaults,
                       std::vector<double> lr_scales)
    : AdamW(std::move(groups), std::move(defaults)), lr_scales_(std::move(lr_scales)) {
  TORCH_CHECK(lr_scales_.size() == param_groups().size(), "FusedAdamW: ", lr_scales_.size(), " lr scales for ",
              param_groups().size(), " parameter groups");
}

void FusedAdamW::set_learning_rate(double lr) {
  auto& groups = param_groups();
  for (size_t i = 0; i < groups.size(); ++i)
    static_cast<torch::optim::AdamWOptions&>(groups[i].options()).lr(lr * (i < lr_scales_.size() ? lr_scales_[i] : 1.0));
}

at::Tensor FusedAdamW::step(LossClosure closure) {
  for (const auto& group : param_groups())
    if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad()) return AdamW::step(closure);
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  at::NoGradGuard no_grad;
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    std::map<std::tuple<int, int, int>, FusedBatch> batches;  // (device type, index, dtype)
    // The kernel reads each step count from a tensor; parameters that share a
    // count (all of them, in training) share one tensor per device.
    std::map<std::tuple<int, int, int64_t>, at::Tensor> step_tensors;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = state()[p.unsafeGetTensorImpl()];
      if (!slot) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& s = static_cast<torch::optim::AdamWParamState&>(*slot);
      s.step(s.step() + 1);
      const auto device = p.device();
      auto& count = step_tensors[{static_cast<int>(device.type()), device.index(), s.step()}];
      if (!count.defined()) count = at::full({}, static_cast<double>(s.step()), p.options().dtype(at::kFloat));
      auto& batch = batches[{static_cast<int>(device.type()), device.index(), static_cast<int>(p.scalar_type())}];
      batch.params.push_back(p);
      batch.grads.push_back(p.grad());
      batch.exp_avgs.push_back(s.exp_avg());
      batch.exp_avg_sqs.push_back(s.exp_avg_sq());
      batch.steps.push_back(count);
    }
    const auto [beta1, beta2] = options.betas();
    for (auto& [key, b] : batches)
      at::_fused_adamw_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, b.steps, options.lr(),
                        beta1, beta2, options.weight_decay(), options.eps(), /*amsgrad=*/false,
                        /*maximize=*/false);
  }
  return loss;
}

}  // namespace cqk
