#pragma once
// Loading a finished (or paused) run's model, shared by eval, generate and inspect.
#include <cstdint>
#include <string>

#include "cqk/config.h"
#include "cqk/model.h"

namespace cqk::cli {

// `target` is a run directory (its newest readable checkpoint) or a checkpoint
// file RUN/checkpoints/step-*.ckpt. Fills the run's config, the checkpoint read
// and its step; the model is in eval mode on `device_name` (auto|cpu|cuda;
// empty: the run's train.device). Defined in eval_command.cpp.
TransformerLM load_trained_model(const std::string& target, const std::string& device_name, Config& config,
                                 std::string& checkpoint, int64_t& step);

}  // namespace cqk::cli
