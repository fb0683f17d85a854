#pragma once
// One training step, in two halves, and its optimizer and gradient clipping,
// shared by `cqk train` (trainer.cpp) and `cqk bench train` (benchmark.cpp), so
// that the benchmark times the step that trains. Between the halves the
// trainer agrees the loss over ranks and stops on a non-finite loss before any
// parameter changes.
#include <c10/core/Device.h>
#include <torch/optim/adamw.h>

#include <memory>
#include <string>
#include <vector>

#include "cqk/batch_source.h"
#include "cqk/config.h"
#include "cqk/distributed.h"
#include "cqk/fused_adamw.h"
#include "cqk/model.h"

namespace cqk {

// The trainer's AdamW parameter groups: decoupled weight decay on matrices
// only (embeddings, norms, biases and MTA parameters per train.decay_* flags),
// lr train.lr; the coupling's parameters take train.coupling_lr_scale times
// the lr and are decayed only with train.decay_coupling (their own groups when
// these differ from the rest). The first two groups (decayed, not; scale 1)
// always exist, possibly empty. `cqk bench train` hands them to
// scripts/bench_pytorch.py, so that its optimizer is this one.
struct OptimizerGroup {
  bool decayed = true;  // weight decay train.weight_decay, else 0
  double lr_scale = 1.0;
  std::vector<std::string> names;  // the parameters' full names, in the model's order
  std::vector<at::Tensor> params;
};
std::vector<OptimizerGroup> optimizer_groups(TransformerLM& model, const TrainConfig& train);

// FusedAdamW over optimizer_groups().
std::unique_ptr<FusedAdamW> make_optimizer(TransformerLM& model, const TrainConfig& train);

// The global L2 norm of the parameters' gradients; when it exceeds max_norm
// (> 0; 0 or less: never), the gradients are scaled by max_norm / (norm + 1e-6),
// as torch::nn::utils::clip_grad_norm_ does. Unlike that function it leaves
// the gradients alone when the factor would be 1 (torch multiplies every
// gradient by 1.0: a pass over all of them per step for nothing).
double clip_gradient_norm(const std::vector<at::Tensor>& parameters, double max_norm);

struct StepContext {
  TransformerLM& model;
  FusedAdamW& optimizer;
  BatchSource& source;
  const TrainConfig& train;
  c10::Device device;
  bool bf16 = false;          // bf16 autocast for the forward passes (device.h)
  DistributedContext& dist;   // a one-process context syncs nothing
};

// Zeroes the gradients, then forward and backward of train.grad_accum
// micro-batches from the source; their gradients are averaged over ranks
// during the last backward pass. Returns this rank's loss (the micro-batches'
// mean).
double accumulate_gradients(StepContext& step);

// Clips the gradients to train.grad_clip and takes the optimizer step at its
// current learning rate. Returns the gradient norm before clipping.
double apply_gradients(StepContext& step);

}  // namespace cqk
