#pragma once
// The training loop behind `cqk train`: AdamW with decoupled weight decay,
// warmup + cosine/WSD schedule, accumulation, periodic evaluation, atomic
// checkpoints and exact resume (the step, its optimizer and clipping:
// train_step.h). See docs/ARCHITECTURE.md for a step's data flow.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cqk/batch_source.h"
#include "cqk/config.h"
#include "cqk/evaluation.h"
#include "cqk/model.h"

namespace cqk {

struct TrainOptions {
  std::string run_dir;      // empty: from the config (run.dir or runs/<name>-seed<seed>)
  bool resume = false;      // continue the run in run_dir from its newest checkpoint
  int64_t max_steps = 0;    // > 0: stop (with a checkpoint) after this many steps in this invocation
  std::string profile_steps;          // "A:B": Kineto trace of steps A..B in RUN/profile/ (train/step_profiler.h)
  int64_t memory_snapshot_step = 0;   // > 0, CUDA: the allocator's snapshot after this step in RUN/profile/
};

enum class TrainOutcome { Finished, Paused, Interrupted, Diverged };

struct TrainSummary {
  TrainOutcome outcome = TrainOutcome::Finished;
  int64_t step = 0;
  std::string run_dir;
  Evaluation valid, test;   // final evaluation (when finished)
  std::string sdpa_backend;  // torch's SDPA backend at the model's attention shape (sdpa_backend.h)
};

// Runs (or resumes) a training run; throws std::runtime_error / std::invalid_argument
// with a one-line message on bad input.
TrainSummary train(const Config& config, const TrainOptions& options);

// The resolved config stored in a run directory (for --resume, eval).
Config load_run_config(const std::string& run_dir);

// The config hash that the checkpoints and results.json of the run in run_dir
// carry if `config` is its config: the hash of its config.yaml as written
// (stored_config_hash) when that file reads back as `config`, so that a newer
// cqk whose to_yaml has more keys still continues older runs; else
// config_hash(config), which they do not carry (a changed config is refused).
std::string run_config_hash(const std::string& run_dir, const Config& config);

// Exit status of `cqk train` for an outcome (0 finished or paused, 130 interrupted, 3 diverged).
int exit_code(TrainOutcome outcome);

}  // namespace cqk
