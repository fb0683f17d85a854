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
// "step" and "tokens" are the axes, not scalars.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& metrics_line);

class TensorBoardLog {
 public:
  // A new event file in `dir`. The events of the folder's earlier files up to
  // `kept_through_step` (a resume's checkpoint step; -1 for a new run) move
  // into it and those files go, so each tag stays one curve. A damaged
  // earlier file keeps its readable events and is reported once.
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
