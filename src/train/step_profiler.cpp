#include "train/step_profiler.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>

#include "cqk/log.h"

namespace cqk {
namespace {

namespace fs = std::filesystem;

constexpr const char* kStepRange = "cqk::step";
constexpr const char* kOutside = "outside cqk ranges";

bool is_cqk_range(const std::string& name) { return name.rfind("cqk::", 0) == 0 && name != kStepRange; }

// Rows from (name -> time, calls), largest time first, with their share of the steps.
std::vector<ProfileRow> rows_by_time(const std::map<std::string, std::pair<double, int64_t>>& totals, double step_ms) {
  std::vector<ProfileRow> rows;
  for (const auto& [name, total] : totals)
    rows.push_back({name, total.first, total.second, step_ms > 0 ? total.first / step_ms : 0.0});
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.self_ms > b.self_ms; });
  return rows;
}

std::vector<ProfiledEvent> profiled_events(const torch::autograd::profiler::ProfilerResult& result) {
  std::vector<ProfiledEvent> events;
  for (const auto& e : result.events()) {
    if (e.isAsync() || e.endNs() < e.startNs()) continue;
    events.push_back({e.name(), e.startThreadId(), e.startNs(), e.endNs(), e.deviceType() != c10::DeviceType::CPU});
  }
  return events;
}

}  // namespace

ProfileSteps parse_profile_steps(const std::string& text, const std::string& flag) {
  ProfileSteps steps;
  char extra = 0;
  long long first = 0, last = 0;
  if (std::sscanf(text.c_str(), "%lld:%lld%c", &first, &last, &extra) != 2 || first < 1 || last < first)
    throw std::invalid_argument(flag + ": expected A:B with 1 <= A <= B (steps, 1-based, inclusive), got '" + text + "'");
  steps.first = first;
  steps.last = last;
  return steps;
}

ProfileSummary summarize_profile(const std::vector<ProfiledEvent>& events) {
  // Per thread, events nest by time: each one's parent is the innermost event still open at its start.
  std::map<uint64_t, std::vector<size_t>> by_thread;
  for (size_t i = 0; i < events.size(); ++i)
    if (!events[i].on_device) by_thread[events[i].thread].push_back(i);
  std::vector<double> child_ns(events.size(), 0.0);
  std::vector<std::string> range(events.size(), kOutside);
  std::vector<bool> in_step(events.size(), false);
  for (auto& [thread, order] : by_thread) {
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return events[a].start_ns != events[b].start_ns ? events[a].start_ns < events[b].start_ns
                                                      : events[a].end_ns > events[b].end_ns;
    });
    std::vector<size_t> open;
    for (const size_t i : order) {
      while (!open.empty() && events[open.back()].end_ns < events[i].end_ns) open.pop_back();
      if (!open.empty()) {
        const size_t parent = open.back();
        child_ns[parent] += static_cast<double>(events[i].end_ns - events[i].start_ns);
        range[i] = range[parent];
        in_step[i] = in_step[parent];
      }
      if (is_cqk_range(events[i].name)) range[i] = events[i].name;
      if (events[i].name == kStepRange) in_step[i] = true;
      open.push_back(i);
    }
  }

  ProfileSummary summary;
  std::map<std::string, std::pair<double, int64_t>> ranges, operators, device;
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    const double ms = static_cast<double>(e.end_ns - e.start_ns) / 1e6;
    if (e.on_device) {
      device[e.name].first += ms;
      ++device[e.name].second;
      continue;
    }
    if (e.name == kStepRange) {
      summary.step_ms += ms;
      ++summary.steps;
      continue;
    }
    if (!in_step[i]) continue;
    const double self_ms = std::max(0.0, ms - child_ns[i] / 1e6);
    ranges[range[i]].first += self_ms;
    if (is_cqk_range(e.name)) ++ranges[e.name].second;
    else {
      operators[e.name].first += self_ms;
      ++operators[e.name].second;
    }
  }
  summary.ranges = rows_by_time(ranges, summary.step_ms);
  summary.operators = rows_by_time(operators, summary.step_ms);
  summary.device = rows_by_time(device, summary.step_ms);
  return summary;
}

std::string describe(const ProfileSummary& summary, size_t top_operators) {
  std::string text;
  char line[256];
  const auto table = [&](const char* title, const std::vector<ProfileRow>& rows, size_t limit) {
    text += title;
    std::snprintf(line, sizeof line, "\n  %-60s %10s %7s %8s\n", "", "self ms", "share", "calls");
    text += line;
    for (size_t i = 0; i < std::min(limit, rows.size()); ++i) {
      const std::string calls = rows[i].calls > 0 ? std::to_string(rows[i].calls) : "-";
      std::snprintf(line, sizeof line, "  %-60.60s %10.3f %6.1f%% %8s\n", rows[i].name.c_str(), rows[i].self_ms,
                    100.0 * rows[i].share, calls.c_str());
      text += line;
    }
  };
  std::snprintf(line, sizeof line, "profile: %lld steps, %.3f ms in all (cqk::step)\n",
                static_cast<long long>(summary.steps), summary.step_ms);
  text += line;
  table("by cqk range (each operator counted once, in its innermost range)", summary.ranges, summary.ranges.size());
  table("operators by self time", summary.operators, top_operators);
  if (!summary.device.empty()) table("GPU kernels and copies by time", summary.device, top_operators);
  return text;
}

StepProfiler::StepProfiler(ProfileSteps steps, std::string trace_path, const c10::Device& device)
    : steps_(steps), trace_path_(std::move(trace_path)), cuda_(device.is_cuda()) {}

StepProfiler::~StepProfiler() {
  if (!recording_) return;
  step_range_.reset();
  torch::autograd::profiler::disableProfiler();
}

void StepProfiler::begin_step(int64_t step) {
  using torch::profiler::impl::ActivityType;
  if (step == steps_.first) {
    // Kineto's GPU probe logs an error where no GPU is visible; the user's own setting wins.
    if (!cuda_) setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
    std::set<ActivityType> activities{ActivityType::CPU};
    if (cuda_) activities.insert(ActivityType::CUDA);
    const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
    recording_ = true;
  }
  if (!recording_) return;
  step_range_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (step_range_->isActive()) step_range_->before(kStepRange, c10::ArrayRef<const c10::IValue>{});
}

void StepProfiler::end_step(int64_t step) {
  if (!recording_) return;
  if (cuda_) torch::cuda::synchronize();  // the step's kernels end inside its range
  step_range_.reset();
  if (step < steps_.last) return;
  auto result = torch::autograd::profiler::disableProfiler();
  recording_ = false;
  const auto folder = fs::path(trace_path_).parent_path();
  if (!folder.empty()) fs::create_directories(folder);
  result->save(trace_path_);
  log::info("profile of steps " + std::to_string(steps_.first) + "-" + std::to_string(steps_.last) + " written to " +
            trace_path_ + " (chrome://tracing or ui.perfetto.dev)\n" + describe(summarize_profile(profiled_events(*result)), 15));
}

}  // namespace cqk
