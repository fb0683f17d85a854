#pragma once
// The training loop behind `cqk train`: AdamW with decoupled weight decay,
// warmup + cosine/WSD schedule, clipping, accumulation, periodic evaluation,
// atomic checkpoints and exact resume. See docs/ARCHITECTURE.md for a step's data flow.
#include <torch/optim/adamw.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cqk/batch_source.h"
#include "cqk/config.h"
#include "cqk/evaluation.h"
#include "cqk/fused_adamw.h"
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

// The trainer's AdamW parameter groups: decoupled weight decay on matrices
// only (embeddings, norms, biases and MTA parameters per train.decay_* flags),
// lr train.lr; the coupling's parameters take train.coupling_lr_scale times
// the lr and are decayed only with train.decay_coupling (their own groups when
// these differ from the rest). The first two groups (decayed, not; scale 1)
// always exist, possibly empty. `cqk bench train` hands them to
// scripts/bench_pytorch.py, so that its optimizer is this one.
struct OptimizerGroup {
  bool decayed = true;  // weight decay train.weight_decay, else 0
  double lr_scale = 1.0;
  std::vector<std::string> names;  // the parameters' full names, in the model's order
  std::vector<at::Tensor> params;
};
std::vector<OptimizerGroup> optimizer_groups(TransformerLM& model, const TrainConfig& train);

// FusedAdamW over optimizer_groups().
std::unique_ptr<FusedAdamW> make_optimizer(TransformerLM& model, const TrainConfig& train);

// The global L2 norm of the parameters' gradients; when it exceeds max_norm
// (> 0; 0 or less: never), the gradients are scaled by max_norm / (norm + 1e-6),
// as torch::nn::utils::clip_grad_norm_ does. Unlike that function it leaves
// the gradients alone when the factor would be 1 (torch multiplies every
// gradient by 1.0: a pass over all of them per step for nothing).
double clip_gradient_norm(const std::vector<at::Tensor>& parameters, double max_norm);

// Exit status of `cqk train` for an outcome (0 finished or paused, 130 interrupted, 3 diverged).
int exit_code(TrainOutcome outcome);

}  // namespace cqk
