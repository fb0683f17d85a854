#pragma once
// A run's trained model as `cqk eval`, `cqk generate` and `cqk export` load it.
#include <string>

#include "cqk/config.h"
#include "cqk/model.h"

namespace cqk {

struct TrainedModel {
  TransformerLM model{nullptr};  // in eval mode on the chosen device
  Config config;                 // the run's config.yaml
  std::string run_dir;
  std::string checkpoint;        // the checkpoint file read
  int64_t step = 0;
};

// `target` is a run directory (its newest readable checkpoint) or a checkpoint
// file RUN/checkpoints/step-*.ckpt; `device_name` auto|cpu|cuda (empty: the
// run's train.device). Throws std::runtime_error naming what is missing or bad.
TrainedModel load_trained_model(const std::string& target, const std::string& device_name);

}  // namespace cqk
