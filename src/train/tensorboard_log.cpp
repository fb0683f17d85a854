#include "train/tensorboard_log.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "cqk/log.h"
#include "train/event_file.h"

namespace cqk {
namespace {

namespace fs = std::filesystem;

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// TensorBoard's naming (the name must hold "tfevents"; it reads the files of a folder in name order).
std::string event_file_name() {
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const auto seconds = static_cast<long long>(wall_time());
  return "events.out.tfevents." + std::to_string(seconds) + "." + host + "." + std::to_string(getpid()) + ".cqk";
}

}  // namespace

std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& metrics_line) {
  std::vector<std::pair<std::string, double>> scalars;
  for (const auto& [key, value] : metrics_line.items()) {
    if (key == "step" || key == "tokens" || key == "time") continue;
    if (key == "coupling") {
      // Per layer, then the mean over layers of each diagnostic.
      std::vector<std::pair<std::string, std::pair<double, int>>> means;
      for (const auto& layer : value) {
        const std::string prefix = "coupling/layer" + std::to_string(layer.at("layer").get<int64_t>()) + "/";
        for (const auto& [name, figure] : layer.items()) {
          if (name == "layer") continue;
          scalars.emplace_back(prefix + name, figure.get<double>());
          auto mean = std::find_if(means.begin(), means.end(), [&](const auto& m) { return m.first == name; });
          if (mean == means.end()) mean = means.insert(means.end(), {name, {0.0, 0}});
          mean->second.first += figure.get<double>();
          ++mean->second.second;
        }
      }
      for (const auto& [name, sum] : means) scalars.emplace_back("coupling/mean/" + name, sum.first / sum.second);
      continue;
    }
    if (!value.is_number()) continue;
    std::string tag = "train/" + key;
    for (const char* split : {"valid", "test"}) {
      const std::string prefix = std::string(split) + "_";
      if (key.rfind(prefix, 0) == 0) tag = std::string(split) + "/" + key.substr(prefix.size());
    }
    scalars.emplace_back(tag, value.get<double>());
  }
  return scalars;
}

TensorBoardLog::TensorBoardLog(const std::string& dir, int64_t kept_through_step) {
  fs::create_directories(dir);
  path_ = (fs::path(dir) / event_file_name()).string();
  if (fs::exists(path_)) path_ += ".1";  // the same second and pid as an earlier file
  out_.open(path_, std::ios::binary | std::ios::trunc);
  write(event_file::file_version_event(wall_time()));
  // A resume: the earlier files stay as they are (a reader may be reading them
  // now), and their events past the checkpoint are dropped by readers.
  if (kept_through_step >= 0) write(event_file::session_start_event(wall_time(), kept_through_step + 1));
}

void TensorBoardLog::write(const std::string& event) {
  if (failed_) return;
  event_file::write_record(out_, event);
  out_.flush();
  if (!out_) {
    failed_ = true;
    log::warn("tensorboard: cannot write " + path_ + "; TensorBoard logging stops, training goes on");
  }
}

void TensorBoardLog::write_metrics(const nlohmann::json& metrics_line) {
  write(event_file::scalars_event(wall_time(), metrics_line.at("step").get<int64_t>(),
                                  tensorboard_scalars(metrics_line)));
}

void TensorBoardLog::write_text(int64_t step, const std::string& tag, const std::string& text) {
  write(event_file::text_event(wall_time(), step, tag, text));
}

}  // namespace cqk
