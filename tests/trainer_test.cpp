#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>

#include <ATen/ATen.h>
#include <dirent.h>
#include <torch/serialize.h>
#include <torch/serialize/input-archive.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

#include "cqk/checkpoint.h"
#include "cqk/config_loader.h"
#include "cqk/model.h"
#include "cqk/sweep_results.h"
#include "cqk/evaluation_report.h"
#include "cqk/train_step.h"
#include "cqk/trainer.h"
#include "train/run_lock.h"
#include "saved_model.h"
#include "temp_dir.h"
#include "test_io.h"
#include "tiny_run.h"

// cqk::train end to end on a tiny recall model (a second or two per run on one
// thread): exact resume, the run folder, refusing to clobber a run, divergence.
namespace {

using cqk::testing::folder_entries;
using cqk::testing::read_file;

using cqk::testing::expect_same_weights;
using cqk::testing::TempDir;
using cqk::testing::tiny_run_config;

cqk::TrainOptions in_dir(const TempDir& dir, int64_t max_steps = 0, bool resume = false) {
  cqk::TrainOptions options;
  options.run_dir = dir.path();
  options.max_steps = max_steps;
  options.resume = resume;
  return options;
}

// The message of the `Error` that `fn` throws ("" and a failure if none).
template <typename Error = std::runtime_error, typename Fn>
std::string message_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no " << typeid(Error).name() << " thrown";
  return "";
}

// The CPU RNG state stored in a checkpoint file (after the 24-byte header).
at::Tensor stored_rng_state(const std::string& checkpoint) {
  const auto file = read_file(checkpoint);
  std::istringstream payload(file.substr(8 + 2 * sizeof(uint64_t)));
  torch::serialize::InputArchive archive;
  archive.load_from(payload);
  at::Tensor rng;
  archive.read("rng_cpu", rng);
  return rng;
}

// The model of a checkpoint file, read with torch's archive only.
void load_model(const std::string& checkpoint, cqk::TransformerLM& model) {
  const auto file = read_file(checkpoint);
  std::istringstream payload(file.substr(8 + 2 * sizeof(uint64_t)));
  torch::serialize::InputArchive archive, model_archive;
  archive.load_from(payload);
  archive.read("model", model_archive);
  model->load(model_archive);
}

// A run paused twice and resumed ends bitwise where an uninterrupted run does.
void check_exact_resume(const std::string& attention) {
  const auto config = tiny_run_config({"model.attention.kind=" + attention, "model.attention.coupling.kind=affine"});
  TempDir straight("cqk-train-a"), paused("cqk-train-b");
  const auto a = cqk::train(config, in_dir(straight));
  ASSERT_EQ(a.outcome, cqk::TrainOutcome::Finished);
  EXPECT_EQ(a.step, 12);

  auto b = cqk::train(config, in_dir(paused, 5));
  ASSERT_EQ(b.outcome, cqk::TrainOutcome::Paused);
  EXPECT_EQ(b.step, 5);
  EXPECT_EQ(cqk::list_checkpoints(paused.path()).back(), cqk::checkpoint_path(paused.path(), 5));
  b = cqk::train(config, in_dir(paused, 4, true));
  ASSERT_EQ(b.outcome, cqk::TrainOutcome::Paused);
  EXPECT_EQ(b.step, 9);
  b = cqk::train(config, in_dir(paused, 0, true));
  ASSERT_EQ(b.outcome, cqk::TrainOutcome::Finished);
  EXPECT_EQ(b.step, 12);

  expect_same_weights(straight / "model.pt", paused / "model.pt", attention);
  EXPECT_EQ(a.valid.loss, b.valid.loss) << attention;
  EXPECT_EQ(a.test.loss, b.test.loss) << attention;
  // The training metrics of the steps logged by both runs agree too.
  std::map<int64_t, double> losses;
  for (const auto* dir : {&straight, &paused}) {
    std::istringstream lines(read_file(*dir / "metrics.jsonl"));
    for (std::string line; std::getline(lines, line);) {
      const auto j = nlohmann::json::parse(line);
      if (!j.contains("loss")) continue;
      const auto [it, inserted] = losses.emplace(j["step"].get<int64_t>(), j["loss"].get<double>());
      if (!inserted) EXPECT_EQ(it->second, j["loss"].get<double>()) << attention << " step " << it->first;
    }
  }
  EXPECT_EQ(losses.size(), 6u) << attention;  // steps 2, 4, ..., 12
  // The final checkpoints agree as well, down to the RNG state they would restore.
  const auto last_a = cqk::list_checkpoints(straight.path()).back();
  const auto last_b = cqk::list_checkpoints(paused.path()).back();
  EXPECT_EQ(last_b, cqk::checkpoint_path(paused.path(), 12));
  EXPECT_TRUE(at::equal(stored_rng_state(last_a), stored_rng_state(last_b))) << attention;
}

TEST(Trainer, ResumeIsExactForAffineOnVanillaAttention) { check_exact_resume("vanilla"); }

TEST(Trainer, ResumeIsExactForAffineOnDifferentialAttention) { check_exact_resume("diff"); }

TEST(Trainer, FinishedRunFolderHoldsConfigMetricsResultsLogAndFewCheckpoints) {
  TempDir dir("cqk-train");
  const auto config = tiny_run_config();
  const auto summary = cqk::train(config, in_dir(dir));
  ASSERT_EQ(summary.outcome, cqk::TrainOutcome::Finished);
  EXPECT_EQ(summary.run_dir, dir.path());
  EXPECT_EQ(summary.step, 12);
  EXPECT_GT(summary.valid.tokens, 0);
  EXPECT_TRUE(std::isfinite(summary.valid.perplexity));
  EXPECT_NEAR(summary.valid.perplexity, std::exp(summary.valid.loss), 1e-9 * summary.valid.perplexity);

  // config.yaml: the resolved config (vocab size filled in from the data).
  const auto stored = cqk::load_run_config(dir.path());
  auto resolved = config;
  resolved.model.vocab_size = 32;
  EXPECT_EQ(cqk::config_hash(stored), cqk::config_hash(resolved));
  EXPECT_EQ(stored.model.width, 32);
  EXPECT_EQ(stored.train.steps, 12);

  // metrics.jsonl: one JSON object a line; training lines, evaluation lines
  // and last the final evaluations over the whole splits.
  std::istringstream lines(read_file(dir / "metrics.jsonl"));
  int training_lines = 0, valid_lines = 0, final_lines = 0;
  for (std::string line; std::getline(lines, line);) {
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(line)) << line;
    ASSERT_TRUE(j.is_object()) << line;
    ASSERT_TRUE(j.contains("step")) << line;
    if (j.contains("test_ppl")) {
      ++final_lines;
      EXPECT_EQ(j["step"].get<int64_t>(), 12) << line;
      EXPECT_DOUBLE_EQ(j["valid_ppl"].get<double>(), summary.valid.perplexity) << line;
      EXPECT_DOUBLE_EQ(j["test_loss"].get<double>(), summary.test.loss) << line;
      continue;
    }
    if (j.contains("valid_ppl")) {
      ++valid_lines;
      EXPECT_TRUE(std::isfinite(j["valid_ppl"].get<double>())) << line;
      EXPECT_GE(j["valid_ppl"].get<double>(), 1.0) << line;
      // The coupling's diagnostics, one entry per layer, affine: all four.
      ASSERT_TRUE(j.contains("coupling")) << line;
      const auto layers = cqk::coupling_from_json(j["coupling"]);
      EXPECT_EQ(static_cast<int64_t>(layers.size()), config.model.layers) << line;
      for (const auto& layer : layers) {
        EXPECT_GT(layer.q_change + layer.k_change, 0.0) << line;  // trained away from the identity
        EXPECT_TRUE(layer.mean_abs_log_scale && layer.mean_log_det) << line;
      }
      continue;
    }
    ++training_lines;
    for (const char* key : {"loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "mfu", "rss_mb"}) {
      ASSERT_TRUE(j.contains(key)) << key << " missing: " << line;
      EXPECT_TRUE(j[key].is_number()) << key << ": " << line;
      EXPECT_TRUE(std::isfinite(j[key].get<double>())) << key << ": " << line;
    }
    EXPECT_EQ(j["step"].get<int64_t>() % 2, 0) << line;  // log_every 2
    EXPECT_GT(j["tokens_per_s"].get<double>(), 0.0) << line;
    EXPECT_GT(j["lr"].get<double>(), 0.0) << line;
    EXPECT_GT(j["step_time_s"].get<double>(), 0.0) << line;
    EXPECT_GT(j["rss_mb"].get<double>(), 1.0) << line;
    EXPECT_FALSE(j.contains("cuda_peak_mb")) << line;  // a CPU run
  }
  EXPECT_EQ(training_lines, 6);
  EXPECT_EQ(valid_lines, 2);  // steps 4 and 8
  EXPECT_EQ(final_lines, 1);
  // tb/: one event file (log.tensorboard is on by default; tests/tensorboard_check.py reads it).
  const auto event_files = folder_entries(dir / "tb");
  ASSERT_EQ(event_files.size(), 1u);
  EXPECT_NE(event_files.front().find("tfevents"), std::string::npos) << event_files.front();

  // results.json
  const auto results = nlohmann::json::parse(read_file(dir / "results.json"));
  EXPECT_EQ(results["name"], "tiny");
  EXPECT_EQ(results["seed"], config.run.seed);
  EXPECT_EQ(results["steps"], 12);
  EXPECT_DOUBLE_EQ(results["valid_ppl"].get<double>(), summary.valid.perplexity);
  EXPECT_DOUBLE_EQ(results["test_ppl"].get<double>(), summary.test.perplexity);
  EXPECT_GT(results["params"].get<int64_t>(), results["coupling_params"].get<int64_t>());
  EXPECT_GT(results["coupling_params"].get<int64_t>(), 0);  // the default config couples with affine
  EXPECT_EQ(results["config_hash"], cqk::config_hash(resolved));
  EXPECT_EQ(static_cast<int64_t>(cqk::coupling_from_json(results["coupling"]).size()), config.model.layers);

  EXPECT_FALSE(read_file(dir / "train.log").empty());

  const auto checkpoints = cqk::list_checkpoints(dir.path());
  ASSERT_FALSE(checkpoints.empty());
  EXPECT_LE(checkpoints.size(), static_cast<size_t>(config.train.keep_checkpoints));
  EXPECT_EQ(checkpoints.back(), cqk::checkpoint_path(dir.path(), 12));
  EXPECT_EQ(folder_entries(dir / "checkpoints").size(), checkpoints.size());  // no temporary files left
  for (const auto& name : folder_entries(dir.path())) EXPECT_EQ(name.find(".tmp."), std::string::npos) << name;
}

TEST(Trainer, TensorBoardCanBeTurnedOff) {
  TempDir dir("cqk-train");
  ASSERT_EQ(cqk::train(tiny_run_config({"log.tensorboard=false", "train.steps=2"}), in_dir(dir)).outcome,
            cqk::TrainOutcome::Finished);
  for (const auto& name : folder_entries(dir.path())) EXPECT_NE(name, "tb");
}

// A tb/ that cannot be a folder costs the run its TensorBoard files, with a warning, and nothing else.
TEST(Trainer, AnUnusableTensorBoardFolderDoesNotStopTheRun) {
  TempDir dir("cqk-train");
  { std::ofstream(dir / "tb") << "a file where the folder would go"; }
  ASSERT_EQ(cqk::train(tiny_run_config({"train.steps=2"}), in_dir(dir)).outcome, cqk::TrainOutcome::Finished);
  EXPECT_NE(read_file(dir / "train.log").find("TensorBoard logging is off"), std::string::npos);
  EXPECT_FALSE(read_file(dir / "metrics.jsonl").empty());
}

// MFU is measured against the matmul peak of the run's start, also after a
// resume (a new measurement would make the curve jump): the peak each
// metrics line implies, tokens/s x FLOPs per token / MFU, is one number.
TEST(Trainer, AResumedRunKeepsItsMfuPeak) {
  TempDir dir("cqk-train");
  const auto config = tiny_run_config({"train.steps=6", "train.log_every=1"});
  ASSERT_EQ(cqk::train(config, in_dir(dir, 3)).outcome, cqk::TrainOutcome::Paused);
  ASSERT_EQ(cqk::train(config, in_dir(dir, 0, true)).outcome, cqk::TrainOutcome::Finished);
  auto model_config = config.model;
  model_config.vocab_size = 32;  // tiny_run_config's recall vocabulary
  const double flops_per_token = cqk::TransformerLM(model_config)->flops_per_token(config.data.seq_len);
  std::vector<double> implied;
  std::istringstream lines(read_file(dir / "metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("mfu")) implied.push_back(j["tokens_per_s"].get<double>() * flops_per_token / j["mfu"].get<double>());
  }
  ASSERT_EQ(implied.size(), 6u);
  for (size_t i = 1; i < implied.size(); ++i) EXPECT_NEAR(implied[i] / implied[0], 1.0, 1e-9) << "step " << i + 1;
  EXPECT_NE(read_file(dir / "train.log").find("MFU against the peak measured when the run started"),
            std::string::npos);
}

// A metrics.jsonl that cannot be appended to costs its lines, with one warning, and nothing else.
TEST(Trainer, AMetricsFileThatCannotBeWrittenIsReportedOnce) {
  TempDir dir("cqk-train");
  std::filesystem::create_directories(dir / "metrics.jsonl");  // a folder where the file would go
  ASSERT_EQ(cqk::train(tiny_run_config({"train.steps=4", "train.log_every=1"}), in_dir(dir)).outcome,
            cqk::TrainOutcome::Finished);
  const auto log = read_file(dir / "train.log");
  const std::string warning = "metrics.jsonl: cannot append (disk full?)";
  ASSERT_NE(log.find(warning), std::string::npos) << log;
  EXPECT_EQ(log.find(warning, log.find(warning) + 1), std::string::npos) << "warned more than once:\n" << log;
}

// --profile-steps: a Chrome trace (trace-event JSON) holding each of cqk's
// ranges, and the table in the run's log.
TEST(Trainer, ProfileStepsWriteATraceWithCqkRanges) {
  TempDir dir("cqk-train");
  auto options = in_dir(dir);
  options.profile_steps = "3:4";
  ASSERT_EQ(cqk::train(tiny_run_config({"train.steps=5"}), options).outcome, cqk::TrainOutcome::Finished);
  const auto trace = nlohmann::json::parse(read_file(dir / "profile/steps-3-4.json"));
  ASSERT_TRUE(trace.contains("traceEvents") && trace["traceEvents"].is_array());
  std::map<std::string, int> ranges;
  for (const auto& event : trace["traceEvents"]) {
    const auto name = event.value("name", std::string());
    if (name.rfind("cqk::", 0) == 0 && event.value("ph", std::string()) == "X") ++ranges[name];
  }
  EXPECT_EQ(ranges["cqk::step"], 2);
  for (const char* range : {"cqk::forward", "cqk::attention", "cqk::coupling", "cqk::mlp", "cqk::loss",
                            "cqk::backward", "cqk::optimizer"})
    EXPECT_GE(ranges[range], 2) << range;
  EXPECT_EQ(ranges["cqk::attention"], 2 * 2);  // two layers, two steps
  const auto log = read_file(dir / "train.log");
  EXPECT_NE(log.find("by cqk range"), std::string::npos);
  EXPECT_NE(log.find("operators by self time"), std::string::npos);
}

TEST(Trainer, ProfileAndSnapshotStepsPastTheRunOrOnTheCpuAreRefused) {
  TempDir dir("cqk-train");
  auto options = in_dir(dir);
  options.profile_steps = "2:13";
  EXPECT_THROW(cqk::train(tiny_run_config(), options), std::invalid_argument);
  options.profile_steps.clear();
  options.memory_snapshot_step = 2;
  try {
    cqk::train(tiny_run_config(), options);
    ADD_FAILURE() << "a memory snapshot on the CPU was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(folder_entries(dir.path()).empty());  // bad input leaves no run behind
}

// A profile range this invocation cannot record whole is refused, not left
// without a trace: steps done before a resume, steps past --max-steps. The
// error also goes to train.log once the run has one.
TEST(Trainer, ProfileStepsThisInvocationCannotRecordAreRefused) {
  TempDir dir("cqk-train");
  const auto config = tiny_run_config({"train.steps=6"});
  auto options = in_dir(dir, 2);
  options.profile_steps = "2:3";
  auto message = message_of<std::invalid_argument>([&] { cqk::train(config, options); });
  EXPECT_EQ(message, "--profile-steps: step 3 is past this invocation's --max-steps (it ends after step 2)");
  EXPECT_TRUE(folder_entries(dir.path()).empty());  // refused before the run directory is made

  ASSERT_EQ(cqk::train(config, in_dir(dir, 2)).outcome, cqk::TrainOutcome::Paused);
  options = in_dir(dir, 0, true);
  options.profile_steps = "2:3";
  message = message_of<std::invalid_argument>([&] { cqk::train(config, options); });
  EXPECT_EQ(message, "--profile-steps: step 2 is done already (the run resumes after step 2)");
  EXPECT_NE(read_file(dir / "train.log").find("error] " + message), std::string::npos) << read_file(dir / "train.log");
}

// An error after the run folder exists goes to train.log too; a train.log that
// cannot be written (a full disk) must not replace that error with its own.
TEST(Trainer, AnUnwritableTrainLogDoesNotHideTheError) {
  TempDir dir("cqk-train");
  const auto config = tiny_run_config({"train.steps=6"});
  ASSERT_EQ(cqk::train(config, in_dir(dir, 2)).outcome, cqk::TrainOutcome::Paused);
  std::filesystem::remove(dir / "train.log");
  std::filesystem::create_symlink("/dev/full", dir / "train.log");
  auto options = in_dir(dir, 0, true);
  options.profile_steps = "1:1";
  EXPECT_EQ(message_of<std::invalid_argument>([&] { cqk::train(config, options); }),
            "--profile-steps: step 1 is done already (the run resumes after step 2)");
}

// One training process per run directory: a second one stops before writing.
TEST(Trainer, ASecondProcessCannotTrainInAFolderInUse) {
  TempDir dir("cqk-train");
  {
    const cqk::RunLock other_process(dir.path());  // flock: another open file description conflicts, in one process too
    const auto message = message_of([&] { cqk::train(tiny_run_config(), in_dir(dir)); });
    EXPECT_EQ(message, dir.path() + ": another cqk process is training this run; wait for it, or choose another run.dir");
    EXPECT_FALSE(std::filesystem::exists(dir / "config.yaml"));
  }
  EXPECT_EQ(cqk::train(tiny_run_config({"train.steps=2"}), in_dir(dir)).outcome, cqk::TrainOutcome::Finished);
}

// A finished run has nothing to resume: a resume would evaluate it again and log its final line twice.
TEST(Trainer, ResumingAFinishedRunIsRefused) {
  TempDir dir("cqk-train");
  const auto config = tiny_run_config({"train.steps=2"});
  ASSERT_EQ(cqk::train(config, in_dir(dir)).outcome, cqk::TrainOutcome::Finished);
  const auto metrics = read_file(dir / "metrics.jsonl");
  const auto message = message_of([&] { cqk::train(config, in_dir(dir, 0, true)); });
  EXPECT_EQ(message, dir.path() + ": the run has finished (results.json); nothing to resume");
  EXPECT_EQ(read_file(dir / "metrics.jsonl"), metrics);
}

TEST(Trainer, RefusesToStartOverAnExistingRunAndToResumeWithoutCheckpoints) {
  TempDir dir("cqk-train");
  const auto config = tiny_run_config();
  ASSERT_EQ(cqk::train(config, in_dir(dir, 3)).outcome, cqk::TrainOutcome::Paused);
  const auto config_before = read_file(dir / "config.yaml");
  auto message = message_of([&] { cqk::train(config, in_dir(dir)); });
  EXPECT_NE(message.find("--resume"), std::string::npos) << message;
  EXPECT_NE(message.find(dir.path()), std::string::npos) << message;
  EXPECT_EQ(read_file(dir / "config.yaml"), config_before);
  EXPECT_EQ(cqk::list_checkpoints(dir.path()).back(), cqk::checkpoint_path(dir.path(), 3));

  TempDir empty("cqk-train-empty");
  message = message_of([&] { cqk::train(config, in_dir(empty, 0, true)); });
  EXPECT_NE(message.find("no checkpoint"), std::string::npos) << message;
  EXPECT_NE(message.find(empty.path()), std::string::npos) << message;

  message = message_of([&] { cqk::load_run_config(empty / "nothing-here"); });
  EXPECT_NE(message.find("config.yaml"), std::string::npos) << message;
}

TEST(Trainer, DivergenceStopsWithoutANewCheckpoint) {
  TempDir dir("cqk-train");
  // A huge step size without clipping; a huge init makes the first steps' logits overflow as well.
  const auto config = tiny_run_config({"train.lr=1.0e6", "train.grad_clip=0", "train.warmup_steps=0",
                                       "train.schedule=constant", "train.checkpoint_every=1",
                                       "train.keep_checkpoints=100", "train.eval_every=100"});
  const auto summary = cqk::train(config, in_dir(dir));
  ASSERT_EQ(summary.outcome, cqk::TrainOutcome::Diverged);
  EXPECT_LT(summary.step, 12);
  EXPECT_EQ(cqk::exit_code(summary.outcome), 3);
  // Checkpoints only of the steps done before the non-finite loss, with finite
  // parameters (the last good one is kept), and no results.
  const auto checkpoints = cqk::list_checkpoints(dir.path());
  EXPECT_FALSE(checkpoints.empty());
  for (const auto& path : checkpoints) {
    EXPECT_LE(path, cqk::checkpoint_path(dir.path(), summary.step)) << path;
    auto model_config = config.model;
    model_config.vocab_size = 32;
    cqk::TransformerLM model(model_config);
    load_model(path, model);
    for (const auto& item : model->named_parameters())
      EXPECT_TRUE(at::isfinite(item.value()).all().item<bool>()) << path << ": " << item.key();
  }
  EXPECT_NE(read_file(dir / "train.log").find("first non-finite"), std::string::npos);
  // diverged.json says so for `cqk stats`.
  const auto divergence = cqk::sweep::read_divergence(dir.path());
  ASSERT_TRUE(divergence.has_value());
  EXPECT_EQ(divergence->name, config.run.name);
  EXPECT_EQ(divergence->seed, config.run.seed);
  EXPECT_EQ(divergence->step, summary.step + 1);
  EXPECT_TRUE(divergence->loss == "nan" || divergence->loss == "inf" || divergence->loss == "-inf")
      << divergence->loss;
  EXPECT_FALSE(divergence->first_non_finite.empty());
  EXPECT_TRUE(folder_entries(dir.path()).size() > 0);
  for (const auto& name : folder_entries(dir.path())) {
    EXPECT_NE(name, "results.json");
    EXPECT_NE(name, "model.pt");
  }
}

// A run that starts in the folder of a diverged one is a new attempt: the
// old diverged.json goes, so `cqk stats` does not call it diverged.
TEST(Trainer, AStartRemovesAnEarlierDivergence) {
  TempDir dir("cqk-train");
  cqk::sweep::write_divergence(dir.path(), {"earlier", 1, 3, "nan", "the loss only"});
  ASSERT_TRUE(cqk::sweep::read_divergence(dir.path()).has_value());
  const auto summary = cqk::train(tiny_run_config({"train.steps=2"}), in_dir(dir));
  ASSERT_EQ(summary.outcome, cqk::TrainOutcome::Finished);
  EXPECT_FALSE(cqk::sweep::read_divergence(dir.path()).has_value());
}

// grad_clip 0 turns clipping off (it used to throw from clip_grad_norm_:
// double's max does not convert to float); the logged grad_norm is still the norm.
TEST(Trainer, GradientClippingCanBeTurnedOff) {
  TempDir dir("cqk-train");
  const auto summary = cqk::train(tiny_run_config({"train.grad_clip=0", "train.steps=4"}), in_dir(dir));
  ASSERT_EQ(summary.outcome, cqk::TrainOutcome::Finished);
  std::istringstream lines(read_file(dir / "metrics.jsonl"));
  int logged = 0;
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("grad_norm")) continue;
    EXPECT_TRUE(std::isfinite(j["grad_norm"].get<double>())) << line;
    EXPECT_GT(j["grad_norm"].get<double>(), 0.0) << line;
    ++logged;
  }
  EXPECT_EQ(logged, 2);
}

// clip_gradient_norm against torch::nn::utils::clip_grad_norm_: the same norm
// and the same gradients, when it clips and when it does not (then it must not
// touch them at all), with a parameter that has no gradient.
TEST(Trainer, ClipGradientNormMatchesTorchAndSkipsTheNoOpScaling) {
  at::manual_seed(3);
  const auto make = [] {
    std::vector<at::Tensor> params{at::randn({5, 3}), at::randn({7}), at::randn({2, 2})};
    for (auto& p : params) p.requires_grad_(true);
    params[0].mutable_grad() = at::randn({5, 3});
    params[1].mutable_grad() = at::randn({7});  // params[2] has no gradient
    return params;
  };
  const auto ours = make();
  std::vector<at::Tensor> theirs;
  for (const auto& p : ours) {
    theirs.push_back(p.detach().clone().requires_grad_(true));
    if (p.grad().defined()) theirs.back().mutable_grad() = p.grad().clone();
  }
  for (const double max_norm : {0.5, 1e3}) {
    const auto version = ours[0].grad()._version();  // bumped by any in-place write
    const double norm = cqk::clip_gradient_norm(ours, max_norm);
    const double expected = torch::nn::utils::clip_grad_norm_(theirs, max_norm);
    EXPECT_NEAR(norm, expected, 1e-6 * expected) << max_norm;
    for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(at::allclose(ours[i].grad(), theirs[i].grad(), 1e-6, 0)) << i;
    if (max_norm > norm) EXPECT_EQ(ours[0].grad()._version(), version) << "scaled by 1 anyway";
    else EXPECT_GT(ours[0].grad()._version(), version);
  }
  EXPECT_FALSE(ours[2].grad().defined());
  EXPECT_GT(cqk::clip_gradient_norm(ours, 0.0), 0.0);  // 0: measure only
}

// The coupling's optimizer settings: by default its parameters share the two
// usual groups; with an lr scale and no decay they get a group of their own,
// which the schedule's lr reaches scaled.
TEST(Trainer, CouplingParametersTakeTheirOwnLearningRateScaleAndDecay) {
  const auto group_of = [](const torch::optim::Optimizer& optimizer, const at::Tensor& p) {
    const auto& groups = optimizer.param_groups();
    for (size_t g = 0; g < groups.size(); ++g)
      for (const auto& q : groups[g].params())
        if (q.is_same(p)) return static_cast<int>(g);
    return -1;
  };
  const auto options = [](const torch::optim::Optimizer& optimizer, int g) {
    return static_cast<const torch::optim::AdamWOptions&>(optimizer.param_groups()[static_cast<size_t>(g)].options());
  };
  // vocab_size is otherwise resolved from the data when training starts.
  const auto coupling_config = tiny_run_config({"model.attention.coupling.kind=affine", "train.lr=0.01",
                                                "model.vocab_size=32"});
  {
    cqk::TransformerLM model(coupling_config.model);
    const auto optimizer = cqk::make_optimizer(model, coupling_config.train);
    ASSERT_EQ(optimizer->param_groups().size(), 2u);
    for (const auto& item : model->named_parameters())
      if (item.key().find(".coupling.") != std::string::npos) EXPECT_EQ(group_of(*optimizer, item.value()), 0);
  }
  auto config = tiny_run_config({"model.attention.coupling.kind=affine", "train.lr=0.01", "model.vocab_size=32",
                                 "train.coupling_lr_scale=10.0", "train.decay_coupling=false"});
  cqk::TransformerLM model(config.model);
  const auto optimizer = cqk::make_optimizer(model, config.train);
  ASSERT_EQ(optimizer->param_groups().size(), 3u);
  int coupling_parameters = 0;
  for (const auto& item : model->named_parameters()) {
    const bool coupling = item.key().find(".coupling.") != std::string::npos;
    const int g = group_of(*optimizer, item.value());
    if (coupling) {
      ++coupling_parameters;
      EXPECT_EQ(g, 2) << item.key();
    } else {
      EXPECT_LT(g, 2) << item.key();
    }
  }
  EXPECT_EQ(coupling_parameters, 2 * 4 * config.model.layers);  // 2 steps x (w1, b1, w2, b2) per layer
  EXPECT_DOUBLE_EQ(options(*optimizer, 2).weight_decay(), 0.0);
  EXPECT_DOUBLE_EQ(options(*optimizer, 0).weight_decay(), config.train.weight_decay);
  optimizer->set_learning_rate(0.5);
  EXPECT_DOUBLE_EQ(options(*optimizer, 0).lr(), 0.5);
  EXPECT_DOUBLE_EQ(options(*optimizer, 1).lr(), 0.5);
  EXPECT_DOUBLE_EQ(options(*optimizer, 2).lr(), 5.0);
}

// MTA's identity-initialised kernel and mixing are decayed as norms and biases
// are (not by default), never as the weight matrices around them.
TEST(Trainer, IdentityInitialisedParametersAreNotDecayedAsMatrices) {
  for (const bool decay_vectors : {false, true}) {
    const auto config = tiny_run_config({"model.attention.kind=mta", "model.attention.mta.every=1",
                                         "model.vocab_size=32",
                                         std::string("train.decay_norms_and_biases=") + (decay_vectors ? "true" : "false")});
    cqk::TransformerLM model(config.model);
    const auto optimizer = cqk::make_optimizer(model, config.train);
    const auto decayed = [&](const at::Tensor& p) {
      for (const auto& group : optimizer->param_groups())
        for (const auto& q : group.params())
          if (q.is_same(p))
            return static_cast<const torch::optim::AdamWOptions&>(group.options()).weight_decay() > 0;
      ADD_FAILURE() << "parameter in no group";
      return false;
    };
    int identity = 0;
    for (const auto& item : model->named_parameters()) {
      if (item.key().find("mta_") != std::string::npos) {
        EXPECT_EQ(decayed(item.value()), decay_vectors) << item.key();
        ++identity;
      } else if (item.key().find("q_proj.weight") != std::string::npos) {
        EXPECT_TRUE(decayed(item.value())) << item.key();
      }
    }
    EXPECT_EQ(identity, 2 * config.model.layers);  // kernel and mixing per layer
  }
}

// Evaluating a run reads its checkpoints against the hash of config.yaml as
// written, which is the hash the trainer gave them: so a newer cqk with more
// keys (and so a different to_yaml) still loads older runs.
TEST(Trainer, StoredConfigHashIsTheHashItsCheckpointsCarry) {
  TempDir dir("cqk-config-hash");
  const auto config = tiny_run_config({"train.steps=4"});
  cqk::train(config, in_dir(dir));
  const auto checkpoints = cqk::list_checkpoints(dir.path());
  ASSERT_FALSE(checkpoints.empty());
  cqk::Config written = cqk::load_run_config(dir.path());
  cqk::TransformerLM model(written.model);
  const auto state = cqk::load_checkpoint(checkpoints.back(), *model, "");
  EXPECT_EQ(cqk::stored_config_hash(dir.path()), state.config_hash);
}

// A run paused by an older cqk, whose config.yaml lacks keys this one added
// (simulated by a config.yaml that reads back the same but is not this cqk's
// to_yaml, and checkpoints carrying that file's hash), continues with
// --resume; a config that reads back differently is still refused.
TEST(Trainer, ResumeContinuesARunWrittenByAnOlderCqk) {
  TempDir dir("cqk-resume-older");
  const auto config = tiny_run_config({"train.steps=4", "train.checkpoint_every=100"});
  ASSERT_EQ(cqk::train(config, in_dir(dir, 2)).outcome, cqk::TrainOutcome::Paused);
  {
    std::ofstream yaml(dir / "config.yaml", std::ios::app);
    yaml << "# a key this cqk does not write\n";
  }
  const auto newest = cqk::list_checkpoints(dir.path()).back();
  cqk::Config written = cqk::load_run_config(dir.path());
  cqk::TransformerLM model(written.model);
  auto optimizer = cqk::make_optimizer(model, written.train);
  auto state = cqk::load_checkpoint(newest, *model, *optimizer, "");
  state.config_hash = cqk::stored_config_hash(dir.path());
  cqk::save_checkpoint(newest, *model, *optimizer, state);

  auto changed = written;
  changed.train.lr *= 2;
  EXPECT_THROW(cqk::train(changed, in_dir(dir, 0, true)), std::runtime_error);
  const auto resumed = cqk::train(written, in_dir(dir, 0, true));
  EXPECT_EQ(resumed.outcome, cqk::TrainOutcome::Finished);
  EXPECT_EQ(resumed.step, 4);
  const auto results = nlohmann::json::parse(read_file(dir / "results.json"));
  EXPECT_EQ(results["config_hash"], state.config_hash);
}

// results.json says "name-keyed" only for a run that started with it: cqk
// stats pairs such runs by seed. A run started by an older cqk (its
// checkpoints carry no initialisation) keeps no label when resumed.
TEST(Trainer, ResultsRecordTheInitialisationTheRunStartedWith) {
  for (const bool older : {false, true}) {
    TempDir dir(older ? "cqk-init-older" : "cqk-init-keyed");
    const auto config = tiny_run_config({"train.steps=4", "train.checkpoint_every=100"});
    ASSERT_EQ(cqk::train(config, in_dir(dir, 2)).outcome, cqk::TrainOutcome::Paused);
    const auto newest = cqk::list_checkpoints(dir.path()).back();
    cqk::Config written = cqk::load_run_config(dir.path());
    cqk::TransformerLM model(written.model);
    auto optimizer = cqk::make_optimizer(model, written.train);
    auto state = cqk::load_checkpoint(newest, *model, *optimizer, "");
    EXPECT_EQ(state.initialisation, "name-keyed");
    if (older) {
      state.initialisation.clear();
      cqk::save_checkpoint(newest, *model, *optimizer, state);
    }
    ASSERT_EQ(cqk::train(written, in_dir(dir, 0, true)).outcome, cqk::TrainOutcome::Finished);
    const auto results = nlohmann::json::parse(read_file(dir / "results.json"));
    EXPECT_EQ(results.contains("initialisation"), !older) << results.dump();
    if (!older) EXPECT_EQ(results["initialisation"], "name-keyed");
  }
}

TEST(Trainer, ExitCodesFollowTheOutcome) {
  EXPECT_EQ(cqk::exit_code(cqk::TrainOutcome::Finished), 0);
  EXPECT_EQ(cqk::exit_code(cqk::TrainOutcome::Paused), 0);
  EXPECT_EQ(cqk::exit_code(cqk::TrainOutcome::Interrupted), 130);
  EXPECT_EQ(cqk::exit_code(cqk::TrainOutcome::Diverged), 3);
}

}  // namespace
