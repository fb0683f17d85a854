#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "cqk/config.h"
#include "cqk/schedule.h"

// Learning-rate schedules: linear warmup, then cosine / WSD / constant.
namespace {

cqk::TrainConfig schedule(const std::string& kind, int64_t steps = 100, int64_t warmup = 10) {
  cqk::TrainConfig train;
  train.schedule = cqk::parse_kind(cqk::kLrScheduleNames, kind, "train.schedule");
  train.steps = steps;
  train.warmup_steps = warmup;
  train.lr = 3e-3;
  train.min_lr_ratio = 0.1;
  train.decay_fraction = 0.2;
  return train;
}

TEST(Schedule, WarmupIsLinearFromLrOverWarmupToLr) {
  for (const std::string kind : {"cosine", "wsd", "constant"}) {
    const auto train = schedule(kind);
    EXPECT_DOUBLE_EQ(cqk::learning_rate(train, 0), train.lr / 10) << kind;
    for (int64_t step = 0; step < train.warmup_steps; ++step)
      EXPECT_NEAR(cqk::learning_rate(train, step), train.lr * static_cast<double>(step + 1) / 10, 1e-15)
          << kind << " step " << step;
    EXPECT_DOUBLE_EQ(cqk::learning_rate(train, train.warmup_steps - 1), train.lr) << kind;
    // The first step after warmup is at the peak.
    EXPECT_DOUBLE_EQ(cqk::learning_rate(train, train.warmup_steps), train.lr) << kind;
  }
}

TEST(Schedule, CosineReachesTheFloorAtTheLastStepAndIsMonotoneAfterWarmup) {
  for (const int64_t warmup : {0, 10}) {
    const auto train = schedule("cosine", 100, warmup);
    const double floor = train.lr * train.min_lr_ratio;
    EXPECT_NEAR(cqk::learning_rate(train, train.steps - 1), floor, 1e-15) << "warmup " << warmup;
    double previous = cqk::learning_rate(train, warmup);
    EXPECT_DOUBLE_EQ(previous, train.lr);
    for (int64_t step = warmup + 1; step < train.steps; ++step) {
      const double lr = cqk::learning_rate(train, step);
      EXPECT_LT(lr, previous) << "step " << step;
      EXPECT_GE(lr, floor - 1e-15) << "step " << step;
      previous = lr;
    }
    // Halfway through the decay: the mean of peak and floor.
    const auto odd = schedule("cosine", 2 * 45 + 1 + warmup, warmup);
    EXPECT_NEAR(cqk::learning_rate(odd, warmup + 45), (odd.lr + floor) / 2, 1e-15);
  }
}

TEST(Schedule, WsdIsFlatThenDecaysLinearlyOverTheLastFraction) {
  const auto train = schedule("wsd", 100, 10);
  const double floor = train.lr * train.min_lr_ratio;
  const int64_t decay_start = 80;  // decay_fraction 0.2 of 100 steps
  for (int64_t step = train.warmup_steps; step < decay_start; ++step)
    EXPECT_DOUBLE_EQ(cqk::learning_rate(train, step), train.lr) << "step " << step;
  for (int64_t step = decay_start; step < train.steps; ++step) {
    const double progress = static_cast<double>(step - decay_start + 1) / 20.0;
    EXPECT_NEAR(cqk::learning_rate(train, step), train.lr + (floor - train.lr) * progress, 1e-15) << "step " << step;
  }
  EXPECT_NEAR(cqk::learning_rate(train, train.steps - 1), floor, 1e-15);
  // Linear: equal decrements.
  const double d1 = cqk::learning_rate(train, 85) - cqk::learning_rate(train, 86);
  const double d2 = cqk::learning_rate(train, 95) - cqk::learning_rate(train, 96);
  EXPECT_NEAR(d1, d2, 1e-15);
  EXPECT_NEAR(d1, (train.lr - floor) / 20.0, 1e-15);
}

TEST(Schedule, ConstantStaysAtThePeak) {
  const auto train = schedule("constant", 50, 5);
  for (int64_t step = 5; step < 50; ++step) EXPECT_DOUBLE_EQ(cqk::learning_rate(train, step), train.lr);
  const auto no_warmup = schedule("constant", 50, 0);
  EXPECT_DOUBLE_EQ(cqk::learning_rate(no_warmup, 0), no_warmup.lr);
}

}  // namespace
