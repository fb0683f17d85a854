#pragma once
// Learning-rate schedules: linear warmup, then cosine decay, warmup-stable-decay
// (WSD, linear decay over the last fraction of steps) or constant.
#include <cstdint>

#include "cqk/config.h"

namespace cqk {

// The learning rate of optimizer step `step` (0-based) of `train.steps`.
double learning_rate(const TrainConfig& train, int64_t step);

}  // namespace cqk
