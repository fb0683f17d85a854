#include "cqk/trainer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>

#include "cqk/atomic_file.h"
#include "cqk/checkpoint.h"
#include "cqk/config_loader.h"
#include "cqk/device.h"
#include "cqk/distributed.h"
#include "cqk/evaluation_report.h"
#include "cqk/fused_adamw.h"
#include "cqk/log.h"
#include "cqk/matmul_peak.h"
#include "cqk/progress.h"
#include "cqk/runtime.h"
#include "cqk/schedule.h"
#include "cqk/sdpa_backend.h"
#include "cqk/sweep_results.h"
#include "cqk/token_loader.h"
#include "cqk/train_step.h"
#include "train/distributed_test_hooks.h"
#include "train/memory_usage.h"
#include "train/metrics_log.h"
#include "train/run_lock.h"
#include "train/run_setup.h"
#include "train/step_profiler.h"

namespace cqk {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::atomic<int> g_stop_signal{0};
extern "C" void request_stop(int signal) { g_stop_signal.store(signal); }

// SIGINT/SIGTERM ask the loop to checkpoint and leave; the previous handlers come back after.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal.store(0);
    previous_int_ = std::signal(SIGINT, request_stop);
    previous_term_ = std::signal(SIGTERM, request_stop);
  }
  ~StopSignals() { release(); }
  int pending() const { return g_stop_signal.load(); }
  // From here on a signal does what it did before training (the default: end the process).
  void release() {
    if (released_) return;
    std::signal(SIGINT, previous_int_);
    std::signal(SIGTERM, previous_term_);
    released_ = true;
  }

 private:
  void (*previous_int_)(int);
  void (*previous_term_)(int);
  bool released_ = false;
};

}  // namespace

namespace {

std::string default_run_dir(const Config& config) {
  if (!config.run.dir.empty()) return config.run.dir;
  return (fs::path("runs") / (config.run.name + "-seed" + std::to_string(config.run.seed))).string();
}

// A process killed while writing a checkpoint leaves its temporary file (as
// large as a checkpoint) behind, which nothing else removes.
void remove_stale_temporaries(const std::string& run_dir) {
  std::error_code ec;
  int removed = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(run_dir) / "checkpoints", ec)) {
    const auto name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && name.find(".ckpt.tmp.") != std::string::npos && fs::remove(entry.path(), ec))
      ++removed;
  }
  if (removed > 0)
    log::info("removed " + std::to_string(removed) + " temporary checkpoint file(s) of an interrupted write");
}

// A profile range this invocation, starting after `done` steps, records whole;
// one it cannot would leave no trace, silently.
void check_profile_range(const ProfileSteps& steps, int64_t done, int64_t max_steps) {
  if (steps.first <= done)
    throw std::invalid_argument("--profile-steps: step " + std::to_string(steps.first) +
                                " is done already (the run resumes after step " + std::to_string(done) + ")");
  if (max_steps > 0 && steps.last > done + max_steps)
    throw std::invalid_argument("--profile-steps: step " + std::to_string(steps.last) +
                                " is past this invocation's --max-steps (it ends after step " +
                                std::to_string(done + max_steps) + ")");
}

// The name of the first parameter or gradient that is not finite, for the divergence message.
std::string first_non_finite(TransformerLM& model) {
  for (const auto& item : model->named_parameters()) {
    if (!at::isfinite(item.value()).all().item<bool>()) return "parameter " + item.key();
    const auto& grad = item.value().grad();
    if (grad.defined() && !at::isfinite(grad).all().item<bool>()) return "gradient of " + item.key();
  }
  return "the loss only (parameters and gradients are finite)";
}

// An evaluation over every rank's share of the split (unchanged with one process).
// `progress`: the progress line's label (rank 0 only), empty for none.
Evaluation evaluate_split(DistributedContext& dist, TransformerLM& model, BatchSource& source, Split split,
                          int64_t max_batches, const c10::Device& device, const TargetTables& tables,
                          const std::string& progress = "") {
  auto sums = evaluation_sums(model, source, split, max_batches, device, tables, dist.is_main() ? progress : "");
  if (dist.enabled()) sums = EvaluationSums::from_vector(dist.all_reduce_sum(sums.to_vector()));
  return summarize(sums, evaluated_words(source, split, max_batches));
}

// The newest readable checkpoint of run_dir, restored into the model and the
// optimizer, and its path; a corrupt newest file falls back to the one before it.
std::pair<TrainingState, std::string> resume_from_checkpoints(const std::string& run_dir, TransformerLM& model,
                                                              FusedAdamW& optimizer, const std::string& hash) {
  const auto checkpoints = list_checkpoints(run_dir);
  if (checkpoints.empty()) throw std::runtime_error(run_dir + ": no checkpoint to resume from");
  for (auto it = checkpoints.rbegin();; ++it) {
    try {
      return {load_checkpoint(*it, *model, optimizer, hash), *it};
    } catch (const std::runtime_error& e) {
      if (std::next(it) == checkpoints.rend()) throw;
      log::warn(std::string(e.what()) + "; trying the previous checkpoint");
    }
  }
}

// An evaluation line of metrics.jsonl: the validation metrics, flat, and the coupling's diagnostics.
nlohmann::json evaluation_line(const TrainingState& state, const Evaluation& valid,
                               const std::vector<CouplingDiagnostics>& coupling) {
  auto line = nlohmann::json{{"step", state.step}, {"tokens", state.tokens}};
  line.update(flat_evaluation_json("valid_", valid));
  if (!coupling.empty()) line["coupling"] = coupling_json(coupling);
  return line;
}

// results.json: what the run was, its final evaluations and its coupling.
void write_results(const std::string& run_dir, const Config& config, const TrainingState& state,
                   const ParameterBreakdown& breakdown, const TrainSummary& summary,
                   const std::vector<CouplingDiagnostics>& coupling, const std::string& hash) {
  nlohmann::json results = {{"name", config.run.name},
                            {"seed", config.run.seed},
                            {"steps", state.step},
                            {"tokens", state.tokens},
                            {"params", breakdown.total()},
                            {"coupling_params", breakdown.coupling},
                            {"valid_ppl", summary.valid.perplexity},
                            {"test_ppl", summary.test.perplexity},
                            {"valid", evaluation_json(summary.valid)},
                            {"test", evaluation_json(summary.test)},
                            {"config_hash", hash},
                            {"sdpa_backend", summary.sdpa_backend}};
  if (!state.initialisation.empty()) results["initialisation"] = state.initialisation;
  if (!coupling.empty()) results["coupling"] = coupling_json(coupling);
  write_file_atomically((fs::path(run_dir) / "results.json").string(), results.dump(2) + "\n");
}

}  // namespace

int exit_code(TrainOutcome outcome) {
  switch (outcome) {
    case TrainOutcome::Interrupted: return 130;
    case TrainOutcome::Diverged: return 3;
    default: return 0;
  }
}

Config load_run_config(const std::string& run_dir) {
  const auto path = (fs::path(run_dir) / "config.yaml").string();
  if (!fs::exists(path)) throw std::runtime_error(run_dir + ": not a run directory (no config.yaml)");
  return load_config(path);
}

std::string run_config_hash(const std::string& run_dir, const Config& config) {
  const std::string hash = config_hash(config);
  if (!fs::exists(fs::path(run_dir) / "config.yaml")) return hash;
  return config_hash(load_run_config(run_dir)) == hash ? stored_config_hash(run_dir) : hash;
}

namespace {

TrainSummary run_training(const Config& input_config, const TrainOptions& options) {
  Config config = input_config;
  validate(config);
  const auto dist_env = distributed_environment();  // one process unless RANK/WORLD_SIZE (or srun) say otherwise
  const std::string run_dir = options.run_dir.empty() ? default_run_dir(config) : options.run_dir;
  const auto config_path = (fs::path(run_dir) / "config.yaml").string();
  if (!options.resume && !list_checkpoints(run_dir).empty())
    throw std::runtime_error(run_dir + ": already holds checkpoints of a run; continue it with `cqk train --resume " +
                             run_dir + "` or choose another run.dir");
  // A finished run whose checkpoints are gone (deleted for space, keep_checkpoints) still holds its results.
  if (fs::exists(fs::path(run_dir) / "results.json"))
    throw std::runtime_error(run_dir + (options.resume ? ": the run has finished (results.json); nothing to resume"
                                                       : ": already holds a finished run (results.json); choose "
                                                         "another run.dir, or remove the folder to train it again"));

  auto setup = set_up_run(config, dist_env.rank, dist_env.world_size);
  config = std::move(setup.config);
  const int threads = setup.threads;
  auto source = std::move(setup.source);
  const std::string hash = options.resume ? run_config_hash(run_dir, config) : config_hash(config);
  const auto device = rank_device(choose_device(config.train.device), dist_env);
  DistributedContext dist(dist_env, device);  // rendezvous and process group; a no-op for one process
  // Ranks of one run share the config, the data and this command's options; a rank with another
  // --max-steps, say, would otherwise wait in a collective until the timeout.
  const std::string fingerprint = data_fingerprint(config.data);
  dist.check_same_run("config " + hash + "; data " + fingerprint + "; resume " +
                      (options.resume ? "yes" : "no") + "; max-steps " + std::to_string(options.max_steps) +
                      "; profile-steps " + (options.profile_steps.empty() ? "none" : options.profile_steps));
  const auto info = [&](const std::string& message) {
    if (dist.is_main()) log::info(message);
  };

  const bool bf16 = use_bf16(config.train, device);
  std::optional<StepProfiler> profiler;
  ProfileSteps profile_steps;
  if (!options.profile_steps.empty()) {
    const auto steps = profile_steps = parse_profile_steps(options.profile_steps, "--profile-steps");
    if (!options.resume) check_profile_range(steps, 0, options.max_steps);  // before the run directory is made
    if (steps.last > config.train.steps)
      throw std::invalid_argument("--profile-steps: step " + std::to_string(steps.last) + " is past train.steps (" +
                                  std::to_string(config.train.steps) + ")");
    const std::string rank = dist_env.world_size > 1 ? "-rank" + std::to_string(dist_env.rank) : "";
    profiler.emplace(steps, (fs::path(run_dir) / "profile" /
                             ("steps-" + std::to_string(steps.first) + "-" + std::to_string(steps.last) + rank + ".json"))
                                .string(),
                     device);
  }
  if (options.memory_snapshot_step > config.train.steps)
    throw std::invalid_argument("--memory-snapshot-step: step " + std::to_string(options.memory_snapshot_step) +
                                " is past train.steps (" + std::to_string(config.train.steps) + ")");
  if (options.memory_snapshot_step > 0) record_cuda_memory_history(device);
  TransformerLM model(config.model, static_cast<uint64_t>(config.run.seed));
  model->to(device);
  auto optimizer = make_optimizer(model, config.train);
  const auto breakdown = model->parameter_breakdown();

  // The run directory is made only once the config, the data and the model are
  // known to work, so that bad input never leaves a half-made run behind.
  fs::create_directories(fs::path(run_dir) / "checkpoints");
  // Rank 0 locks the folder, and every rank learns whether it could: a refusal
  // then ends them all now, not at the next collective's timeout.
  std::optional<RunLock> lock;
  std::string lock_refused;
  if (dist.is_main()) {
    try {
      lock.emplace(run_dir);
      // Checked again under the lock: another process may have trained or finished a run here since the
      // checks above.
      if (fs::exists(fs::path(run_dir) / "results.json") || (!options.resume && !list_checkpoints(run_dir).empty()))
        throw std::runtime_error(run_dir + ": another process trained a run here meanwhile; " +
                                 (options.resume ? "it has finished" : "choose another run.dir"));
    } catch (const std::runtime_error& e) {
      lock_refused = e.what();
    }
  }
  if (dist.all_reduce_sum({lock_refused.empty() ? 0.0 : 1.0})[0] > 0)
    throw std::runtime_error(dist.is_main() ? lock_refused
                                            : run_dir + ": rank 0 could not take the run (its error says why)");
  if (dist_env.rank == 0) log::add_file((fs::path(run_dir) / "train.log").string());
  if (!options.resume && dist.is_main()) {
    write_file_atomically(config_path, to_yaml(config));
    // Evaluations saved for an earlier run in this folder (cqk eval --save) are not this run's.
    const auto saved = sweep::saved_evaluations_folder(run_dir);
    std::error_code error;
    if (fs::exists(saved) && fs::remove_all(saved, error) > 0 && !error)
      log::info("removed " + saved.string() + ": the saved evaluations of an earlier run in this folder");
  }
  if (dist.is_main()) remove_stale_temporaries(run_dir);

  // Measured before a resume restores the RNG state: the measurement draws random matrices.
  const double measured_peak = measure_matmul_flops(device, bf16 ? at::kBFloat16 : at::kFloat);

  TrainingState state;
  state.config_hash = hash;
  state.initialisation = sweep::kNameKeyedInitialisation;  // a resume takes the checkpoint's instead
  state.data_fingerprint = fingerprint;
  if (options.resume) {
    std::string checkpoint;
    std::tie(state, checkpoint) = resume_from_checkpoints(run_dir, model, *optimizer, hash);
    check_data_fingerprint(state.data_fingerprint, config.data);
    state.data_fingerprint = fingerprint;  // a run from before it was recorded records it now
    info("resumed from " + checkpoint + " at step " + std::to_string(state.step));
    if (state.peak_flops > 0)
      info("MFU against the peak measured when the run started, " + std::to_string(state.peak_flops / 1e9) +
           " GFLOP/s (measured now: " + std::to_string(measured_peak / 1e9) + ")");
    source->seek_train(state.data_position);
  }
  if (profiler) check_profile_range(profile_steps, state.step, options.max_steps);
  if (state.peak_flops <= 0) state.peak_flops = measured_peak;  // a new run, or one from before it was kept
  const double peak_flops = state.peak_flops;
  dist.broadcast_parameters(*model);
  dist.attach_gradient_sync(model->parameters());

  const int64_t tokens_per_step = config.data.batch_size * config.data.seq_len * config.train.grad_accum;
  const double flops_per_token = model->flops_per_token(config.data.seq_len);
  info("run " + run_dir + " | " + breakdown.describe());
  const std::string sdpa_backend =
      use_sdpa_backend(config, config.data.batch_size / dist_env.world_size, bf16, device.is_cuda());
  info("device " + device.str() + (bf16 ? " bf16 autocast" : " fp32") + " | threads " + std::to_string(threads) +
       " | " + std::to_string(tokens_per_step) + " tokens/step | MFU peak " + std::to_string(peak_flops / 1e9) +
       " GFLOP/s | SDPA " + sdpa_backend);
  const TargetTables tables = target_tables(*source);  // one pass over the training split, for every evaluation
  // The coupling's diagnostics (coupling_diagnostics.h) on one fixed validation batch at every evaluation:
  // the whole first global batch, which rank 0 (the one that reports them) draws alone, so that they are
  // those of the same run in one process.
  const auto diagnostics_batches = [&] {
    if (!dist.is_main()) return std::vector<Batch>{};
    if (!dist.enabled()) return source->eval_batches(Split::Valid, 1);
    return make_batch_source(config.data, config.run.seed)->eval_batches(Split::Valid, 1);
  };
  const auto coupling_batch = [&, batches = diagnostics_batches()]() {
    return batches.empty() ? std::vector<CouplingDiagnostics>{}
                           : coupling_diagnostics(model, batches.front().inputs.to(device));
  };

  // One writer, rank 0; what an interrupted process logged past the checkpoint goes.
  std::optional<MetricsLog> metrics;
  if (dist.is_main()) {
    metrics.emplace(run_dir, config.log.tensorboard, options.resume ? state.step : -1);
    if (!options.resume) metrics->write_config(to_yaml(config));
  }
  const auto save = [&] {
    if (!dist.is_main()) return;  // one writer; every rank resumes from it
    save_checkpoint(checkpoint_path(run_dir, state.step), *model, *optimizer, state);
    prune_checkpoints(run_dir, config.train.keep_checkpoints);
  };

  // The run trains again: an earlier divergence is no longer its state (kept until here, so that a resume
  // refused above leaves it).
  if (dist.is_main()) fs::remove(sweep::divergence_path(run_dir));
  StepContext step{model, *optimizer, *source, config.train, device, bf16, dist};
  StopSignals signals;
  ProgressLine progress(config.train.steps, state.step, config.train.log_every);
  model->train();
  TrainSummary summary;
  summary.run_dir = run_dir;
  summary.sdpa_backend = sdpa_backend;
  const int64_t first_step = state.step;
  auto window_start = Clock::now();
  int64_t window_tokens = 0;
  int64_t window_steps = 0;
  double tokens_per_second = 0.0;

  while (state.step < config.train.steps) {
    crash_rank_for_test_if_requested(dist.rank(), state.step);
    const double lr = learning_rate(config.train, state.step);
    optimizer->set_learning_rate(lr);
    if (profiler) profiler->begin_step(state.step + 1);
    double loss_value = accumulate_gradients(step);
    // The mean loss over ranks, and whether any rank was asked to stop, so all ranks decide alike.
    const auto agreed = dist.all_reduce_sum({loss_value, signals.pending() ? 1.0 : 0.0});
    loss_value = agreed[0] / dist.world_size();
    state.data_position = source->train_position();
    if (!std::isfinite(loss_value)) {
      progress.finish();
      if (dist.is_main()) {
        const sweep::Divergence divergence{config.run.name, config.run.seed, state.step + 1,
                                           std::isnan(loss_value) ? "nan" : loss_value > 0 ? "inf" : "-inf",
                                           first_non_finite(model)};
        log::error("loss became " + divergence.loss + " at step " + std::to_string(divergence.step) +
                   "; first non-finite: " + divergence.first_non_finite +
                   ". The last good checkpoint is kept; lower train.lr or enable train.grad_clip.");
        try {
          sweep::write_divergence(run_dir, divergence);
        } catch (const std::exception& e) {  // the run still diverged: exit 3, not an error
          log::warn(std::string("cannot record the divergence for cqk stats: ") + e.what());
        }
      }
      summary.outcome = TrainOutcome::Diverged;
      summary.step = state.step;
      return summary;
    }
    const double grad_norm = apply_gradients(step);
    ++state.step;
    if (profiler) {  // writing a trace is no training step: the window leaves it out, as evaluations
      const auto trace_start = Clock::now();
      profiler->end_step(state.step);
      window_start += Clock::now() - trace_start;
    }
    if (state.step == options.memory_snapshot_step && dist.is_main())
      write_cuda_memory_snapshot(
          (fs::path(run_dir) / "profile" / ("memory-step-" + std::to_string(state.step) + ".pickle")).string());
    state.tokens += tokens_per_step;
    window_tokens += tokens_per_step;
    ++window_steps;

    const double window_seconds = std::chrono::duration<double>(Clock::now() - window_start).count();
    if (state.step % config.train.log_every == 0 || state.step == config.train.steps) {
      tokens_per_second = window_tokens / std::max(window_seconds, 1e-9);
      const double mfu = tokens_per_second * flops_per_token / (peak_flops * dist.world_size());
      nlohmann::json line = {{"step", state.step},
                             {"tokens", state.tokens},
                             {"loss", loss_value},
                             {"lr", lr},
                             {"grad_norm", grad_norm},
                             {"tokens_per_s", tokens_per_second},
                             {"step_time_s", window_seconds / window_steps},
                             {"mfu", mfu}};
      line.update(memory_usage(device));
      if (metrics) metrics->append(line);
      window_start = Clock::now();
      window_tokens = 0;
      window_steps = 0;
    }
    // Until the first logged window, the rate of the steps so far.
    const double shown_rate = tokens_per_second > 0 ? tokens_per_second
                                                    : window_tokens / std::max(window_seconds, 1e-9);
    char detail[160];
    std::snprintf(detail, sizeof detail, "loss %.4f | lr %.2e | %.0f tok/s", loss_value, lr, shown_rate);
    if (dist.is_main()) progress.update(state.step, detail);

    // Evaluation and checkpoint time stays out of the next window's tokens/s, step time and MFU.
    const auto pause_start = Clock::now();
    const bool stopping = dist.enabled() ? agreed[1] > 0 : signals.pending() != 0;
    // A stop skips the evaluation: the checkpoint comes first within a scheduler's grace period.
    if (!stopping && config.train.eval_every > 0 && state.step % config.train.eval_every == 0 &&
        state.step < config.train.steps) {
      const auto valid =
          evaluate_split(dist, model, *source, Split::Valid, config.train.eval_batches, device, tables);
      const auto coupling = dist.is_main() ? coupling_batch() : std::vector<CouplingDiagnostics>{};
      if (metrics) metrics->append(evaluation_line(state, valid, coupling));
      progress.finish();
      info("step " + std::to_string(state.step) + " valid " + describe(valid));
      if (!coupling.empty()) info("step " + std::to_string(state.step) + " " + describe(coupling));
    }
    const bool periodic = config.train.checkpoint_every > 0 && state.step % config.train.checkpoint_every == 0;
    const bool paused = options.max_steps > 0 && state.step - first_step >= options.max_steps;
    if (periodic || paused || stopping) save();
    window_start += Clock::now() - pause_start;
    if (stopping || (paused && state.step < config.train.steps)) {
      progress.finish();
      summary.outcome = stopping ? TrainOutcome::Interrupted : TrainOutcome::Paused;
      summary.step = state.step;
      info(std::string(stopping ? "interrupted" : "paused") + " at step " + std::to_string(state.step) +
           "; checkpoint saved. Continue with: cqk train --resume " + run_dir);
      return summary;
    }
  }
  progress.finish();
  if (list_checkpoints(run_dir).empty() || state.step % std::max<int64_t>(config.train.checkpoint_every, 1) != 0)
    save();
  // The final evaluations read whole splits (minutes at scale). The last checkpoint is saved, so a signal
  // from here on may end the process at once: `--resume` then only evaluates.
  // Every rank stops, or none: one alone would leave the others in the evaluation's collectives.
  if (dist.all_reduce_sum({signals.pending() ? 1.0 : 0.0})[0] > 0) {  // one process: its own flag
    summary.outcome = TrainOutcome::Interrupted;
    summary.step = state.step;
    info("interrupted before the final evaluation; checkpoint saved. Finish with: cqk train --resume " + run_dir);
    return summary;
  }
  signals.release();
  info("final evaluation: the whole valid and test splits");

  dist.check_parameters_in_sync(*model);
  summary.valid = evaluate_split(dist, model, *source, Split::Valid, 0, device, tables, "final evaluation, valid");
  summary.test = evaluate_split(dist, model, *source, Split::Test, 0, device, tables, "final evaluation, test");
  summary.step = state.step;
  dump_weights_for_test_if_requested(*model, dist.rank());
  if (!dist.is_main()) return summary;  // rank 0 writes the results
  save_weights_for_python((fs::path(run_dir) / "model.pt").string(), *model);
  const auto coupling = coupling_batch();
  // The final evaluations over the whole splits, as the last line.
  auto final_line = nlohmann::json{{"step", state.step}, {"tokens", state.tokens}};
  final_line.update(flat_evaluation_json("valid_", summary.valid));
  final_line.update(flat_evaluation_json("test_", summary.test));
  if (!coupling.empty()) final_line["coupling"] = coupling_json(coupling);
  // results.json first: a run that fails before it is resumed, and must not have logged its final line yet.
  write_results(run_dir, config, state, breakdown, summary, coupling, hash);
  metrics->append(final_line);
  log::info("finished: valid " + describe(summary.valid));
  log::info("finished: test " + describe(summary.test));
  if (!coupling.empty()) log::info("finished: " + describe(coupling));
  return summary;
}

}  // namespace

TrainSummary train(const Config& config, const TrainOptions& options) {
  // run_training adds RUN/train.log once the run directory exists; an error
  // from then on is kept there too (the caller reports it on stderr).
  struct LogFileScope {
    ~LogFileScope() { log::remove_files(); }
  } log_file_scope;
  try {
    return run_training(config, options);
  } catch (const std::exception& e) {
    log::error_in_files(e.what());
    throw;
  }
}

}  // namespace cqk
