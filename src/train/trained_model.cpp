#include "cqk/trained_model.h"

#include <filesystem>
#include <iterator>
#include <stdexcept>
#include <vector>

#include "cqk/checkpoint.h"
#include "cqk/config_loader.h"
#include "cqk/device.h"
#include "cqk/log.h"
#include "cqk/runtime.h"
#include "cqk/token_loader.h"
#include "cqk/trainer.h"

namespace cqk {

namespace fs = std::filesystem;

TrainedModel load_trained_model(const std::string& target, const std::string& device_name) {
  TrainedModel trained;
  std::string& run_dir = trained.run_dir;
  Config& config = trained.config;
  std::vector<std::string> candidates;  // newest first
  if (fs::is_regular_file(target)) {
    // RUN/checkpoints/FILE -> RUN, also for FILE given inside checkpoints/ (-> "..").
    fs::path run = (fs::path(target).parent_path() / "..").lexically_normal();
    if (run.filename().empty()) run = run.parent_path();
    run_dir = run.empty() ? "." : run.string();
    if (!fs::exists(fs::path(run_dir) / "config.yaml"))
      throw std::runtime_error(target + ": expected a checkpoint inside RUN_DIR/checkpoints/, but " + run_dir +
                               " has no config.yaml");
    candidates.push_back(target);
  } else if (fs::is_directory(target)) {
    run_dir = target;
    const auto all = list_checkpoints(run_dir);
    candidates.assign(all.rbegin(), all.rend());
  } else {
    throw std::runtime_error(target + ": no such run directory or checkpoint file");
  }
  config = load_run_config(run_dir);
  if (candidates.empty()) throw std::runtime_error(run_dir + ": the run has no checkpoints yet");
  if (config.model.vocab_size <= 0)
    throw std::runtime_error(run_dir + "/config.yaml: model.vocab_size is not resolved (" +
                             std::to_string(config.model.vocab_size) + ")");
  configure_threads(static_cast<int>(config.train.threads));
  const auto device = device_name.empty() ? choose_device(config.train.device)
                                           : choose_device(parse_kind(kDeviceChoiceNames, device_name, "--device"), "--device");
  const std::string hash = stored_config_hash(run_dir);

  trained.model = TransformerLM(config.model);
  auto& model = trained.model;
  std::string fingerprint;
  for (auto it = candidates.begin(); it != candidates.end(); ++it) {
    try {
      const TrainingState state = load_checkpoint(*it, *model, hash);
      trained.step = state.step;
      trained.checkpoint = *it;
      fingerprint = state.data_fingerprint;
      break;
    } catch (const std::runtime_error& e) {
      if (std::next(it) == candidates.end()) throw;
      log::warn(std::string(e.what()) + "; trying the previous checkpoint");
    }
  }
  check_data_fingerprint(fingerprint, config.data);
  model->to(device);
  model->eval();
  return trained;
}

}  // namespace cqk
