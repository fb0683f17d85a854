#include <gtest/gtest.h>

#include <map>
#include <stdexcept>

#include "train/step_profiler.h"

// The profile table's arithmetic on a hand-made trace (the trace itself is
// checked end to end in trainer_test.cpp).
namespace {

using cqk::ProfiledEvent;

constexpr uint64_t kMs = 1000000;  // ns

std::map<std::string, cqk::ProfileRow> by_name(const std::vector<cqk::ProfileRow>& rows) {
  std::map<std::string, cqk::ProfileRow> out;
  for (const auto& row : rows) out[row.name] = row;
  return out;
}

TEST(StepProfiler, EachOperatorCountsOnceInItsInnermostRange) {
  // Thread 1: a 100 ms step; attention 10-60 holding the coupling 15-25 and an
  // mm 30-50; a softmax in the coupling; an add outside every cqk range but in
  // the step; thread 2: backward work of the same step (autograd's thread) is
  // outside the step range and so left out, as is anything before the step.
  const std::vector<ProfiledEvent> events = {
      {"aten::empty", 1, 0, 1 * kMs},  // before the step
      {"cqk::step", 1, 2 * kMs, 102 * kMs},
      {"cqk::attention", 1, 10 * kMs, 60 * kMs},
      {"cqk::coupling", 1, 15 * kMs, 25 * kMs},
      {"aten::softmax", 1, 16 * kMs, 20 * kMs},
      {"aten::mm", 1, 30 * kMs, 50 * kMs},
      {"aten::add", 1, 70 * kMs, 80 * kMs},
      {"aten::mm", 2, 30 * kMs, 40 * kMs},
      {"gemm_kernel", 0, 30 * kMs, 35 * kMs, /*on_device=*/true},
  };
  const auto summary = cqk::summarize_profile(events);
  EXPECT_EQ(summary.steps, 1);
  EXPECT_DOUBLE_EQ(summary.step_ms, 100.0);

  auto ranges = by_name(summary.ranges);
  ASSERT_EQ(ranges.size(), 3u);
  EXPECT_DOUBLE_EQ(ranges["cqk::attention"].self_ms, 40.0);  // its own 50 - 10 - 20, and the mm's 20
  EXPECT_EQ(ranges["cqk::attention"].calls, 1);
  EXPECT_DOUBLE_EQ(ranges["cqk::coupling"].self_ms, 10.0);   // its own 6 ms and the softmax's 4
  EXPECT_DOUBLE_EQ(ranges["outside cqk ranges"].self_ms, 10.0);  // the add; the step's own time is not an operator
  EXPECT_DOUBLE_EQ(ranges["cqk::coupling"].share, 0.1);
  EXPECT_EQ(summary.ranges.front().name, "cqk::attention");  // largest first

  auto operators = by_name(summary.operators);
  ASSERT_EQ(operators.size(), 3u);
  EXPECT_DOUBLE_EQ(operators["aten::mm"].self_ms, 20.0);
  EXPECT_EQ(operators["aten::mm"].calls, 1);
  EXPECT_DOUBLE_EQ(operators["aten::softmax"].self_ms, 4.0);
  EXPECT_DOUBLE_EQ(operators["aten::add"].share, 0.1);

  ASSERT_EQ(summary.device.size(), 1u);
  EXPECT_DOUBLE_EQ(summary.device.front().self_ms, 5.0);
  const auto text = cqk::describe(summary, 10);
  EXPECT_NE(text.find("cqk::coupling"), std::string::npos) << text;
  EXPECT_NE(text.find("GPU kernels"), std::string::npos) << text;
}

TEST(StepProfiler, StepsFlagNamesWhatIsWrong) {
  const auto steps = cqk::parse_profile_steps("3:7", "--profile-steps");
  EXPECT_EQ(steps.first, 3);
  EXPECT_EQ(steps.last, 7);
  EXPECT_EQ(cqk::parse_profile_steps("5:5", "--profile-steps").last, 5);
  for (const char* bad : {"", "3", "0:2", "5:3", "a:b", "3:4x", "-1:2"}) {
    try {
      cqk::parse_profile_steps(bad, "--profile-steps");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("--profile-steps"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
