#pragma once
// A run's metrics as it trains: RUN/metrics.jsonl (one JSON object a line: the
// training figures every train.log_every steps, each evaluation) and, with
// log.tensorboard, the same scalars in RUN/tb/ (tensorboard_log.h).
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace cqk {

class TensorBoardLog;

class MetricsLog {
 public:
  // Continues from `kept_through_step` (a resume's checkpoint step; -1 for a
  // new run): what an earlier process logged past it is dropped, so each
  // step appears once.
  MetricsLog(const std::string& run_dir, bool tensorboard, int64_t kept_through_step);
  ~MetricsLog();

  void append(const nlohmann::json& line);  // holds "step"
  void write_config(const std::string& yaml);  // TensorBoard's text tab, at step 0

 private:
  std::string path_;
  bool append_failing_ = false;
  std::unique_ptr<TensorBoardLog> tensorboard_;
};

}  // namespace cqk
