#pragma once
// Checkpoints: model, optimizer, step, data position and RNG state in one
// file, written atomically (temporary file, fsync, rename) behind a header with
// a checksum, so a crash mid-write or a corrupt file never passes for a good one.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <optional>
#include <string>
#include <vector>

namespace cqk {

struct TrainingState {
  int64_t step = 0;           // optimizer steps done
  int64_t data_position = 0;  // training batches drawn
  int64_t tokens = 0;         // training tokens seen
  std::string config_hash;    // of the resolved config the run was started with
  // How the run's parameters were initialised when it started (results.json's
  // "initialisation", sweep_results.h); empty for a run started before it was
  // recorded, which a resumed run keeps.
  std::string initialisation;
  // The data it trains on (token_loader.h's data_fingerprint); empty for
  // generated data or a run started before it was recorded.
  std::string data_fingerprint;
  // The matmul peak (FLOP/s) its MFU is measured against, measured when the
  // run started; 0 for a run started before it was recorded. A resume keeps
  // it, so the MFU curve does not jump with each new measurement.
  double peak_flops = 0;
};

void save_checkpoint(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                     const TrainingState& state);
// Restores model, optimizer and RNG state; throws std::runtime_error naming
// the file on a bad header, a checksum mismatch or a different config.
TrainingState load_checkpoint(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                              const std::string& expected_config_hash);
// The model only (eval, generate): the optimizer state and the global RNG are left alone.
TrainingState load_checkpoint(const std::string& path, torch::nn::Module& model,
                              const std::string& expected_config_hash);

// Checkpoint files of a run directory, oldest first.
std::vector<std::string> list_checkpoints(const std::string& run_dir);
std::string checkpoint_path(const std::string& run_dir, int64_t step);
// Deletes all but the newest `keep`.
void prune_checkpoints(const std::string& run_dir, int64_t keep);

// The model's parameters and buffers as a state dict (a pickled dict of name ->
// tensor) that Python reads with torch.load inside
// torch.serialization.safe_globals([torch.jit._pickle.restore_type_tag]) (see README).
void save_weights_for_python(const std::string& path, const torch::nn::Module& model);

}  // namespace cqk
