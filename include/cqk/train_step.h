#pragma once
// One training step, in two halves, shared by `cqk train` (trainer.cpp) and
// `cqk bench train` (benchmark.cpp), so that the benchmark times the step that
// trains. Between the halves the trainer agrees the loss over ranks and stops
// on a non-finite loss before any parameter changes.
#include <c10/core/Device.h>

#include "cqk/batch_source.h"
#include "cqk/config.h"
#include "cqk/distributed.h"
#include "cqk/fused_adamw.h"
#include "cqk/model.h"

namespace cqk {

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
