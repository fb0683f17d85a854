#include "train/tensorboard_log.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "cqk/log.h"
#include "train/event_file.h"

namespace cqk {
namespace {

namespace fs = std::filesystem;

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool is_event_file(const fs::path& path) { return path.filename().string().find("tfevents") != std::string::npos; }

// TensorBoard's naming (the name must hold "tfevents"; it reads the files of a folder in name order).
std::string event_file_name() {
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const auto seconds = static_cast<long long>(wall_time());
  return "events.out.tfevents." + std::to_string(seconds) + "." + host + "." + std::to_string(getpid()) + ".cqk";
}

// The events of the folder's earlier files with step <= kept_through_step, in file
// order, each once (a resume cut short may have copied some already).
std::vector<std::string> carried_events(const std::vector<fs::path>& files, int64_t kept_through_step) {
  std::vector<std::string> kept;
  std::set<std::string> seen;
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    size_t count = 0;
    try {
      while (auto event = event_file::read_record(in)) {
        ++count;
        const auto step = event_file::summary_step(*event);
        if (step && *step <= kept_through_step && seen.insert(*event).second) kept.push_back(*event);
      }
    } catch (const std::runtime_error& e) {
      log::warn("tensorboard: " + file.string() + " is damaged after " + std::to_string(count) +
                " events (" + e.what() + "); kept those");
    }
  }
  return kept;
}

}  // namespace

std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& metrics_line) {
  std::vector<std::pair<std::string, double>> scalars;
  for (const auto& [key, value] : metrics_line.items()) {
    if (key == "step" || key == "tokens") continue;
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
  std::vector<fs::path> earlier;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_regular_file() && is_event_file(entry.path())) earlier.push_back(entry.path());
  std::sort(earlier.begin(), earlier.end());
  const auto carried = carried_events(earlier, kept_through_step);

  fs::create_directories(dir);
  path_ = (fs::path(dir) / event_file_name()).string();
  if (std::find(earlier.begin(), earlier.end(), fs::path(path_)) != earlier.end()) path_ += ".1";  // same second, same pid
  out_.open(path_, std::ios::binary | std::ios::trunc);
  write(event_file::file_version_event(wall_time()));
  for (const auto& event : carried) write(event);
  if (failed_) return;  // the earlier files stay: nothing is lost
  for (const auto& file : earlier) fs::remove(file, ec);
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
