#pragma once
// torch::optim::AdamW with its update done by ATen's fused multi-tensor kernel
// (at::_fused_adamw_): one pass over each parameter, its gradient and moments
// instead of the reference step's dozen elementwise passes.
#include <torch/optim/adamw.h>

namespace cqk {

// The same algorithm, options, state and checkpoint format as
// torch::optim::AdamW (a checkpoint written by either loads into the other);
// results agree to float rounding. amsgrad falls back to the reference step.
class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  at::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace cqk
