#pragma once
// torch::optim::AdamW with its update done by ATen's fused multi-tensor kernel
// (at::_fused_adamw_): one pass over each parameter, its gradient and moments
// instead of the reference step's dozen elementwise passes.
#include <torch/optim/adamw.h>

#include <vector>

namespace cqk {

// The same algorithm, options, state and checkpoint format as
// torch::optim::AdamW (a checkpoint written by either loads into the other);
// results agree to float rounding. amsgrad falls back to the reference step.
class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  // lr_scales: one factor per group, which set_learning_rate applies (a group
  // that trains faster or slower than the schedule, e.g. the coupling's).
  FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::AdamWOptions defaults,
             std::vector<double> lr_scales);

  at::Tensor step(LossClosure closure = nullptr) override;
  // Sets each group's lr to lr times its scale (1 for groups without one).
  void set_learning_rate(double lr);

 private:
  std::vector<double> lr_scales_;
};

}  // namespace cqk
