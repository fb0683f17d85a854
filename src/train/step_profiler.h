#pragma once
// `--profile-steps A:B`: LibTorch's Kineto profiler over chosen training steps,
// written as a Chrome/Perfetto trace, and a table of where the steps' time
// went by cqk's own ranges (cqk::attention, cqk::coupling, cqk::mlp,
// cqk::loss, cqk::backward, cqk::optimizer, ...: RECORD_USER_SCOPE in the model
// and the step) and by operator.
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace at {
class RecordFunction;
}

namespace cqk {

struct ProfileSteps {
  int64_t first = 0;  // 1-based, inclusive; 0: no profile
  int64_t last = 0;
};

// "A:B" with 1 <= A <= B; throws std::invalid_argument naming `flag` otherwise.
ProfileSteps parse_profile_steps(const std::string& text, const std::string& flag);

// An event of the trace, as the table needs it.
struct ProfiledEvent {
  std::string name;
  uint64_t thread = 0;
  uint64_t start_ns = 0, end_ns = 0;
  bool on_device = false;  // a GPU kernel or copy (timed on the device, outside the CPU nesting)
};

// One row of the profile table: time spent in a range or operator itself
// (not in what it calls), its calls and that time's share of the profiled steps.
struct ProfileRow {
  std::string name;
  double self_ms = 0;
  int64_t calls = 0;
  double share = 0;
};

struct ProfileSummary {
  double step_ms = 0;                  // the cqk::step ranges' total
  int64_t steps = 0;
  std::vector<ProfileRow> ranges;      // each CPU op counted once, in its innermost cqk range ("outside cqk ranges" for the rest)
  std::vector<ProfileRow> operators;   // by self time, largest first
  std::vector<ProfileRow> device;      // GPU kernels by time, largest first (empty on the CPU)
};

ProfileSummary summarize_profile(const std::vector<ProfiledEvent>& events);
std::string describe(const ProfileSummary& summary, size_t top_operators);

class StepProfiler {
 public:
  // Records steps [steps.first, steps.last] into `trace_path` (its folder is made).
  StepProfiler(ProfileSteps steps, std::string trace_path, const c10::Device& device);
  ~StepProfiler();  // an interrupted profile is dropped
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  void begin_step(int64_t step);  // the 1-based step about to run
  // After the last profiled step: writes the trace and logs the table.
  void end_step(int64_t step);

 private:
  ProfileSteps steps_;
  std::string trace_path_;
  bool cuda_;
  bool recording_ = false;
  std::unique_ptr<at::RecordFunction> step_range_;
};

}  // namespace cqk
