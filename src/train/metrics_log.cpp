#include "train/metrics_log.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cqk/atomic_file.h"
#include "cqk/log.h"
#include "train/tensorboard_log.h"

namespace cqk {
namespace {

namespace fs = std::filesystem;

// metrics.jsonl without the lines past `kept_through_step` (and without a torn last line).
void drop_lines_after(const std::string& path, int64_t kept_through_step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept;
  bool dropped = false;
  for (std::string line; std::getline(in, line);) {
    const auto entry = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (entry.is_object() && entry.value("step", int64_t{-1}) <= kept_through_step) kept += line + "\n";
    else dropped = true;
  }
  if (dropped) write_file_atomically(path, kept);
}

}  // namespace

MetricsLog::MetricsLog(const std::string& run_dir, bool tensorboard, int64_t kept_through_step)
    : path_((fs::path(run_dir) / "metrics.jsonl").string()) {
  drop_lines_after(path_, kept_through_step);
  if (!tensorboard) return;
  try {
    tensorboard_ = std::make_unique<TensorBoardLog>((fs::path(run_dir) / "tb").string(), kept_through_step);
  } catch (const std::exception& e) {  // a folder that cannot be made, say: the run goes on without
    log::warn(std::string("tensorboard: ") + e.what() + "; TensorBoard logging is off for this run");
  }
}

MetricsLog::~MetricsLog() = default;

void MetricsLog::append(const nlohmann::json& line) {
  auto stamped = line;  // wall-clock seconds since the epoch: loss against time, time lost to a restart
  stamped["time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::ofstream out(path_, std::ios::app);
  out << stamped.dump() << '\n';
  out.flush();
  if (!out && !append_failing_) log::warn(path_ + ": cannot append (disk full?); metrics lines are lost until it can");
  append_failing_ = !out;  // one warning a failing stretch
  if (tensorboard_) tensorboard_->write_metrics(line);
}

void MetricsLog::write_config(const std::string& yaml) {
  if (!tensorboard_) return;
  // Indented four spaces: the text tab renders Markdown, and this keeps the YAML a code block.
  std::istringstream lines(yaml);
  std::string block;
  for (std::string line; std::getline(lines, line);) block += "    " + line + "\n";
  tensorboard_->write_text(0, "config", block);
}

}  // namespace cqk
