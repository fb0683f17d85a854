#pragma once
// RUN/tb/: the run's metrics as TensorBoard event files, written live.
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace cqk {

// The scalars of one metrics.jsonl line under TensorBoard tags: training
// figures as train/<key>, evaluations as valid/<key> and test/<key>
// (valid_seen_loss -> valid/seen_loss), the coupling's diagnostics as
// coupling/layer<L>/<key> and their means over layers as coupling/mean/<key>.
// "step", "tokens" and "time" are axes, not scalars.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& metrics_line);

class TensorBoardLog {
 public:
  // A new event file in `dir`. On a resume (`kept_through_step`, the
  // checkpoint's step; -1 for a new run) it starts with a session start at the
  // next step, so that readers drop what the earlier files hold past the
  // checkpoint and each tag stays one curve; the earlier files are not touched,
  // so a TensorBoard reading them live moves on to the new one.
  TensorBoardLog(const std::string& dir, int64_t kept_through_step);

  void write_metrics(const nlohmann::json& metrics_line);
  void write_text(int64_t step, const std::string& tag, const std::string& text);
  const std::string& path() const { return path_; }

 private:
  // One event, flushed so that a running job shows up; a failed write is
  // reported once and ends this log, never the run.
  void write(const std::string& event);

  std::string path_;
  std::ofstream out_;
  bool failed_ = false;
};

}  // namespace cqk
