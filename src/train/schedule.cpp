#include "cqk/schedule.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace cqk {

double learning_rate(const TrainConfig& train, int64_t step) {
  const double peak = train.lr, floor = train.lr * train.min_lr_ratio;
  if (step < train.warmup_steps) return peak * static_cast<double>(step + 1) / static_cast<double>(train.warmup_steps);
  switch (train.schedule) {
    case LrSchedule::Constant: return peak;
    case LrSchedule::Cosine: {
      // The last step (steps - 1) is at the floor, as WSD's is.
      const double span = std::max<int64_t>(1, train.steps - train.warmup_steps - 1);
      const double progress = std::min(1.0, static_cast<double>(step - train.warmup_steps) / span);
      return floor + (peak - floor) * 0.5 * (1.0 + std::cos(M_PI * progress));
    }
    case LrSchedule::WarmupStableDecay: {
      const auto decay_steps = std::max<int64_t>(1, static_cast<int64_t>(train.decay_fraction * train.steps));
      const int64_t decay_start = train.steps - decay_steps;
      if (step < decay_start) return peak;
      const double progress = std::min(1.0, static_cast<double>(step - decay_start + 1) / decay_steps);
      return peak + (floor - peak) * progress;
    }
  }
  throw std::invalid_argument("train.schedule: not a schedule (" + std::to_string(static_cast<int>(train.schedule)) + ")");
}

}  // namespace cqk
