#include "cqk/train_step.h"

#include "cqk/device.h"
#include "cqk/trainer.h"

#include <ATen/record_function.h>

namespace cqk {

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
