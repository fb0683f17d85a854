#include "cqk/train_step.h"

#include "cqk/device.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <set>

namespace cqk {

// Decoupled weight decay on matrices only; embeddings, norms, biases and the
// identity-initialised MTA parameters are left alone unless the config says so.
std::vector<OptimizerGroup> optimizer_groups(TransformerLM& model, const TrainConfig& train) {
  // Groups by (weight decay, lr scale); the first two always exist, so a run
  // without coupling settings keeps the two groups its checkpoints hold.
  std::vector<OptimizerGroup> groups{{true, 1.0, {}, {}}, {false, 1.0, {}, {}}};
  std::set<const void*> identity_initialised;
  for (const auto& p : model->identity_initialised_parameters()) identity_initialised.insert(p.unsafeGetTensorImpl());
  for (const auto& item : model->named_parameters()) {
    const auto& name = item.key();
    const bool embedding = name.rfind("embedding.", 0) == 0;
    const bool coupling = name.find(".coupling.") != std::string::npos;
    const bool matrix = item.value().dim() >= 2 && !embedding &&
                        identity_initialised.count(item.value().unsafeGetTensorImpl()) == 0;
    const bool decayed = (!coupling || train.decay_coupling) &&
                         (matrix || (embedding && train.decay_embeddings) ||
                          (!matrix && !embedding && train.decay_norms_and_biases));
    const double lr_scale = coupling ? train.coupling_lr_scale : 1.0;
    auto group = std::find_if(groups.begin(), groups.end(), [&](const OptimizerGroup& g) {
      return g.decayed == decayed && g.lr_scale == lr_scale;
    });
    if (group == groups.end()) group = groups.insert(groups.end(), OptimizerGroup{decayed, lr_scale, {}, {}});
    group->names.push_back(name);
    group->params.push_back(item.value());
  }
  return groups;
}

std::unique_ptr<FusedAdamW> make_optimizer(TransformerLM& model, const TrainConfig& train) {
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  std::vector<double> lr_scales;
  for (auto& g : optimizer_groups(model, train)) {
    auto options = std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(train.lr * g.lr_scale)
                                                                    .betas({train.beta1, train.beta2})
                                                                    .eps(train.eps)
                                                                    .weight_decay(g.decayed ? train.weight_decay : 0.0));
    param_groups.emplace_back(std::move(g.params), std::move(options));
    lr_scales.push_back(g.lr_scale);
  }
  return std::make_unique<FusedAdamW>(std::move(param_groups), torch::optim::AdamWOptions(train.lr),
                                      std::move(lr_scales));
}

double clip_gradient_norm(const std::vector<at::Tensor>& parameters, double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return 0.0;
  const double norm = at::stack(at::_foreach_norm(grads, 2)).norm().item<double>();
  const double factor = max_norm / (norm + 1e-6);
  if (max_norm > 0 && factor < 1.0) at::_foreach_mul_(grads, factor);
  return norm;
}

double accumulate_gradients(StepContext& step) {
  step.optimizer.zero_grad();
  const int64_t micro_batches = step.train.grad_accum;
  double loss_value = 0.0;
  for (int64_t micro = 0; micro < micro_batches; ++micro) {
    const auto batch = step.source.next_train();
    at::Tensor loss;
    {
      RECORD_USER_SCOPE("cqk::forward");  // profiler ranges (train/step_profiler.h)
      AutocastScope autocast(step.device, step.bf16);
      loss = step.model->loss(batch.inputs.to(step.device), batch.targets.to(step.device)) /
             static_cast<double>(micro_batches);
    }
    step.dist.begin_backward(micro + 1 == micro_batches);  // all-reduce in the last backward only
    {
      RECORD_USER_SCOPE("cqk::backward");
      loss.backward();
    }
    loss_value += loss.item<double>();
  }
  step.dist.finish_gradient_sync();
  return loss_value;
}

double apply_gradients(StepContext& step) {
  RECORD_USER_SCOPE("cqk::optimizer");
  const double grad_norm = clip_gradient_norm(step.model->parameters(), step.train.grad_clip);
  step.optimizer.step();
  return grad_norm;
}

}  // namespace cqk
