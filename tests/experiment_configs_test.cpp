#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cqk/config_loader.h"
#include "cqk/parameter_count.h"
#include "generated_text.h"
#include "temp_dir.h"
#include "test_io.h"

// The paper's grid in configs/wikitext103: every file loads, its model is within
// 5% of the scale in its path, run names are unique and match the files; and
// scripts/sweep.sh end to end on tiny configs (skip, resume, stats, plots),
// also on generated text from the tokenizer to bits-per-byte statistics.
namespace {

using cqk::testing::read_file;
using cqk::testing::run_command;
using cqk::testing::shell_quote;

namespace fs = std::filesystem;

const fs::path kGrid = fs::path(CQK_SOURCE_DIR) / "configs" / "wikitext103";

// Every *.yaml below `dir`, walked by hand: recursive_directory_iterator
// resolves to libtorch's broken copy in a binary that links it.
void collect_yaml(const fs::path& dir, std::vector<fs::path>& out) {
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_directory()) {
      collect_yaml(entry.path(), out);
    } else if (entry.path().extension() == ".yaml") {
      out.push_back(entry.path());
    }
  }
}

std::vector<fs::path> grid_files() {
  std::vector<fs::path> files;
  collect_yaml(kGrid, files);
  std::sort(files.begin(), files.end());
  return files;
}

// "60m" -> 60e6; 0 when `text` is not a scale.
double scale_of(const std::string& text) {
  static const std::regex scale(R"(([0-9]+)m)");
  std::smatch m;
  return std::regex_match(text, m, scale) ? std::stod(m[1]) * 1e6 : 0.0;
}

struct GridFile {
  fs::path path;
  std::string scale_name;  // "150m"
  double scale = 0;        // 150e6
  bool base = false;       // configs/wikitext103/150m.yaml
  cqk::Config config;
};

std::vector<GridFile> load_grid() {
  std::vector<GridFile> grid;
  for (const auto& path : grid_files()) {
    GridFile f;
    f.path = path;
    f.base = path.parent_path() == kGrid;
    f.scale_name = f.base ? path.stem().string() : path.parent_path().filename().string();
    f.scale = scale_of(f.scale_name);
    f.config = cqk::load_config(path.string());
    grid.push_back(std::move(f));
  }
  return grid;
}

std::string grid_relative(const fs::path& p) { return p.lexically_relative(kGrid).string(); }

TEST(ExperimentConfigs, EveryFileIsWithinFivePercentOfItsScale) {
  const auto grid = load_grid();
  ASSERT_GE(grid.size(), 37u);
  for (const auto& f : grid) {
    SCOPED_TRACE(grid_relative(f.path));
    ASSERT_GT(f.scale, 0) << "no scale (60m, 150m, 455m) in the path";
    const int64_t params = cqk::count_parameters(f.config.model);
    EXPECT_NEAR(static_cast<double>(params) / f.scale, 1.0, 0.05) << params << " parameters";
    EXPECT_EQ(f.config.model.vocab_size, 32000);
    EXPECT_EQ(f.config.model.width / f.config.model.heads, 64) << "head size";
    EXPECT_EQ(f.config.data.kind, cqk::DataKind::Tokens);
    EXPECT_EQ(f.config.data.dir, "data/wikitext-103/tokens");
    EXPECT_EQ(f.config.train.device, cqk::DeviceChoice::Auto);
  }
}

TEST(ExperimentConfigs, RunNamesAreUniqueAndMatchTheFiles) {
  std::map<std::string, std::string> seen;
  for (const auto& f : load_grid()) {
    SCOPED_TRACE(grid_relative(f.path));
    const auto& name = f.config.run.name;
    const std::string expected = f.base ? f.scale_name + "-base" : f.scale_name + "-" + f.path.stem().string();
    EXPECT_EQ(name, expected);
    const auto [it, inserted] = seen.emplace(name, grid_relative(f.path));
    EXPECT_TRUE(inserted) << "run.name '" << name << "' also in " << it->second;
  }
}

TEST(ExperimentConfigs, GridIsComplete) {
  std::map<std::string, cqk::Config> by_name;
  for (auto& f : load_grid()) by_name[f.config.run.name] = f.config;
  const auto get = [&](const std::string& name) -> const cqk::Config* {
    const auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : &it->second;
  };
  for (const std::string scale : {"60m", "150m", "455m"}) {
    for (const std::string attention : {"vanilla", "diff", "qknorm", "mta"}) {
      for (const std::string coupling : {"none", "affine"}) {
        const std::string name = scale + "-" + attention + (coupling == "none" ? "" : "-" + coupling);
        SCOPED_TRACE(name);
        const auto* c = get(name);
        ASSERT_NE(c, nullptr) << "missing";
        EXPECT_EQ(cqk::to_string(c->model.attention.kind()), attention);
        EXPECT_EQ(cqk::to_string(c->model.attention.coupling().kind()), coupling);
        EXPECT_EQ(c->data.seq_len, 512);
      }
    }
  }
  for (const std::string attention : {"vanilla", "diff"}) {
    for (const std::string control : {"noninvertible", "uncoupled", "dynamics"}) {
      const std::string name = "150m-" + attention + "-" + control;
      SCOPED_TRACE(name);
      const auto* c = get(name);
      ASSERT_NE(c, nullptr) << "missing";
      EXPECT_EQ(cqk::to_string(c->model.attention.kind()), attention);
      EXPECT_EQ(cqk::to_string(c->model.attention.coupling().kind()), control);
      // Controls are capacity-matched to the method within 5% (docs/METHOD.md).
      const double affine = cqk::parameter_breakdown(get("150m-" + attention + "-affine")->model).coupling;
      EXPECT_NEAR(cqk::parameter_breakdown(c->model).coupling / affine, 1.0, 0.05);
    }
  }
  for (const std::string variant : {"diff", "diff-affine"}) {
    for (const int64_t seq_len : {1024, 2048}) {
      const std::string name = "455m-" + variant + "-seq" + std::to_string(seq_len);
      SCOPED_TRACE(name);
      const auto* c = get(name);
      ASSERT_NE(c, nullptr) << "missing";
      EXPECT_EQ(c->data.seq_len, seq_len);
      EXPECT_EQ(cqk::to_string(c->model.attention.kind()), "diff");
      EXPECT_EQ(cqk::to_string(c->model.attention.coupling().kind()), variant == "diff" ? "none" : "affine");
    }
  }
}

// The head-norm arms at 60M differ from the run they are compared with only by
// the norm's starting weight.
TEST(ExperimentConfigs, HeadNormArmsChangeOnlyTheNormsStartingWeight) {
  const fs::path scale = kGrid / "60m";
  for (const std::string variant : {"diff", "diff-affine", "mta", "mta-affine"}) {
    SCOPED_TRACE(variant);
    const auto base = cqk::load_config((scale / (variant + ".yaml")).string());
    auto arm = cqk::load_config((scale / (variant + "-headnorm0.05.yaml")).string());
    EXPECT_EQ(arm.model.attention.head_norm_init(), 0.05);
    EXPECT_EQ(base.model.attention.head_norm_init(), 1.0);
    arm.run.name = base.run.name;
    arm.model.attention.head_norm_init() = base.model.attention.head_norm_init();
    EXPECT_EQ(cqk::to_yaml(arm), cqk::to_yaml(base));
  }
}

// The CPU-scale controls (configs/cpu/) differ from cpu/vanilla-affine only by
// the coupling kind, and are capacity-matched to it within 5%.
TEST(ExperimentConfigs, CpuControlsMatchTheAffineCoupling) {
  const fs::path cpu = fs::path(CQK_SOURCE_DIR) / "configs" / "cpu";
  const auto affine = cqk::load_config((cpu / "vanilla-affine.yaml").string());
  const double affine_coupling = cqk::parameter_breakdown(affine.model).coupling;
  for (const std::string control : {"uncoupled", "noninvertible"}) {
    SCOPED_TRACE(control);
    auto c = cqk::load_config((cpu / ("vanilla-" + control + ".yaml")).string());
    EXPECT_EQ(c.run.name, "cpu-vanilla-" + control);
    EXPECT_EQ(cqk::to_string(c.model.attention.coupling().kind()), control);
    EXPECT_NEAR(cqk::parameter_breakdown(c.model).coupling / affine_coupling, 1.0, 0.05);
    // Everything else as the coupled run it is compared with.
    c.run.name = affine.run.name;
    c.model.attention.coupling().kind() = affine.model.attention.coupling().kind();
    EXPECT_EQ(cqk::to_yaml(c), cqk::to_yaml(affine));
  }
}

// Each coupled CPU-scale run (cpu/X-affine.yaml) is its base (cpu/X.yaml) with
// the affine coupling and nothing else changed, so a pair measures the coupling.
TEST(ExperimentConfigs, CpuCoupledRunsDifferFromTheirBaseOnlyByTheCoupling) {
  const fs::path cpu = fs::path(CQK_SOURCE_DIR) / "configs" / "cpu";
  const std::string suffix = "-affine";
  std::set<std::string> bases;
  for (const auto& entry : fs::directory_iterator(cpu)) {
    const std::string stem = entry.path().stem().string();
    if (stem.size() <= suffix.size() || stem.compare(stem.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    SCOPED_TRACE(stem);
    const std::string base_stem = stem.substr(0, stem.size() - suffix.size());
    const auto base = cqk::load_config((cpu / (base_stem + ".yaml")).string());
    auto coupled = cqk::load_config(entry.path().string());
    EXPECT_EQ(coupled.run.name, "cpu-" + stem);
    EXPECT_EQ(cqk::to_string(coupled.model.attention.coupling().kind()), "affine");
    EXPECT_EQ(cqk::to_string(base.model.attention.coupling().kind()), "none");
    coupled.run.name = base.run.name;
    coupled.model.attention.coupling().kind() = base.model.attention.coupling().kind();
    EXPECT_EQ(cqk::to_yaml(coupled), cqk::to_yaml(base));
    bases.insert(base_stem);
  }
  EXPECT_EQ(bases, (std::set<std::string>{"diff", "mta", "qknorm", "vanilla"}));
}

TEST(ExperimentConfigs, EveryRunOfAScaleTrainsOnTheSameTokens) {
  // Variants of a scale differ only in the model (and the micro-batch split):
  // tokens per step and steps are those of the base.
  std::map<std::string, std::pair<int64_t, int64_t>> base;  // scale -> (tokens/step, steps)
  const auto grid = load_grid();
  for (const auto& f : grid) {
    if (f.base) {
      base[f.scale_name] = {f.config.data.batch_size * f.config.data.seq_len * f.config.train.grad_accum,
                            f.config.train.steps};
    }
  }
  ASSERT_EQ(base.size(), 3u);
  for (const auto& f : grid) {
    SCOPED_TRACE(grid_relative(f.path));
    const auto& c = f.config;
    EXPECT_EQ(c.data.batch_size * c.data.seq_len * c.train.grad_accum, base[f.scale_name].first);
    EXPECT_EQ(c.train.steps, base[f.scale_name].second);
  }
}

// ---- scripts/sweep.sh -------------------------------------------------------

int count_of(const std::string& text, const std::string& needle) {
  int n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// A tiny CPU recall config for sweeps: a few seconds per run, one thread.
std::string tiny_sweep_config(const std::string& name, int steps, int checkpoint_every) {
  return "inherit: " + std::string(CQK_SOURCE_DIR) + "/configs/tiny/recall-vanilla.yaml\n" + "run:\n  name: " + name +
         R"(
model:
  width: 16
  layers: 1
  heads: 2
data:
  seq_len: 24
  batch_size: 4
  prefetch: 0
  recall:
    vocab_size: 32
    pairs: 4
    train_examples: 64
    eval_examples: 16
train:
  warmup_steps: 1
  eval_every: 100          # never before the final evaluation
  log_every: 1
  device: cpu
  threads: 1
)" + "  steps: " + std::to_string(steps) + "\n  checkpoint_every: " + std::to_string(checkpoint_every) + "\n";
}

// scripts/sweep.sh on `configs` (shell words) in `dir`, no GPU visible: the jobs run one at a time on the CPU.
std::string sweep_command(const std::string& dir, const std::string& seeds, const std::string& out,
                          const std::string& configs) {
  return "cd " + shell_quote(dir) + " && CUDA_VISIBLE_DEVICES= CQK_BIN=" + shell_quote(CQK_TOOL) + " " +
         shell_quote(std::string(CQK_SOURCE_DIR) + "/scripts/sweep.sh") + " --seeds " + seeds + " --out " +
         shell_quote(out) + " " + configs;
}

TEST(Sweep, TrainsSkipsFinishedRunsAndResumesPausedOnes) {
  cqk::testing::TempDir tmp("cqk-sweep-test");
  // The config lives in tiny/sweep.yaml, so the sweep's folder for it is tiny-sweep.
  fs::create_directories(tmp / "tiny");
  const std::string config = tmp / "tiny/sweep.yaml";
  std::ofstream(config) << tiny_sweep_config("sweep-tiny", 4, 2);
  const std::string out = tmp / "sweep";
  const std::string tool = CQK_TOOL;
  const std::string sweep = sweep_command(tmp.path(), "1,2", out, shell_quote(config));
  const fs::path seed1 = fs::path(out) / "tiny-sweep" / "seed1", seed2 = fs::path(out) / "tiny-sweep" / "seed2";

  // An interrupted run of seed 2: two of its four steps, with a checkpoint.
  const auto paused = run_command(shell_quote(tool) + " train " + shell_quote(config) + " --set run.seed=2 --run-dir " +
                            shell_quote(seed2.string()) + " --max-steps 2");
  ASSERT_EQ(paused.exit_code, 0) << paused.out;
  ASSERT_FALSE(fs::exists(seed2 / "results.json"));

  const auto dry = run_command(sweep + " --dry-run");
  ASSERT_EQ(dry.exit_code, 0) << dry.out;
  EXPECT_NE(dry.out.find("train tiny-sweep seed 1"), std::string::npos) << dry.out;
  EXPECT_NE(dry.out.find("resume tiny-sweep seed 2"), std::string::npos) << dry.out;

  // Inside a batch job of four tasks, as under `sbatch --ntasks 4`: each run is still one process.
  const auto first = run_command("export SLURM_PROCID=0 SLURM_NTASKS=4 SLURM_LOCALID=0 MASTER_ADDR=127.0.0.1; " + sweep);
  ASSERT_EQ(first.exit_code, 0) << first.out << read_file(seed1 / "sweep.log");
  EXPECT_NE(first.out.find("train  tiny-sweep seed 1"), std::string::npos) << first.out;
  EXPECT_NE(first.out.find("resume tiny-sweep seed 2"), std::string::npos) << first.out;
  EXPECT_NE(first.out.find("2 finished, 0 already finished"), std::string::npos) << first.out;
  ASSERT_TRUE(fs::exists(seed1 / "results.json")) << read_file(seed1 / "sweep.log");
  ASSERT_TRUE(fs::exists(seed2 / "results.json")) << read_file(seed2 / "sweep.log");
  const std::string seed2_log = read_file(seed2 / "sweep.log");
  EXPECT_NE(seed2_log.find("--resume"), std::string::npos) << seed2_log;
  EXPECT_NE(seed2_log.find("resumed from"), std::string::npos) << seed2_log;
  EXPECT_NE(read_file(seed2 / "results.json").find("\"seed\": 2"), std::string::npos);
  EXPECT_NE(read_file(seed1 / "results.json").find("\"steps\": 4"), std::string::npos);
  // cqk stats ran on the sweep folder: one variant, two seeds.
  EXPECT_NE(first.out.find("sweep-tiny"), std::string::npos) << first.out;
  EXPECT_TRUE(fs::exists(fs::path(out) / "stats.md"));
  EXPECT_TRUE(fs::exists(fs::path(out) / "stats.csv"));

  const auto results1 = read_file(seed1 / "results.json"), results2 = read_file(seed2 / "results.json");
  const auto log1 = read_file(seed1 / "sweep.log");
  const auto second = run_command(sweep);
  ASSERT_EQ(second.exit_code, 0) << second.out;
  EXPECT_EQ(count_of(second.out, "skip   tiny-sweep seed"), 2) << second.out;
  EXPECT_NE(second.out.find("0 finished, 2 already finished"), std::string::npos) << second.out;
  EXPECT_EQ(read_file(seed1 / "results.json"), results1);
  EXPECT_EQ(read_file(seed2 / "results.json"), results2);
  EXPECT_EQ(read_file(seed1 / "sweep.log"), log1) << "a finished run was started again";

  // A run folder written by an older build, whose config.yaml lacks a key added since (at its default): the same
  // settings, skipped as before.
  const std::string stored = read_file(seed1 / "config.yaml");
  const auto key = stored.find("  decay_coupling: true\n");
  ASSERT_NE(key, std::string::npos) << stored;
  cqk::testing::write_file(seed1 / "config.yaml", stored.substr(0, key) + stored.substr(key + 23));
  const auto older = run_command(sweep);
  EXPECT_EQ(older.exit_code, 0) << older.out;
  EXPECT_EQ(count_of(older.out, "skip   tiny-sweep seed"), 2) << older.out;

  // The config edited, or another --set: its finished runs are of other settings, and refused before anything runs.
  std::ofstream(config) << tiny_sweep_config("sweep-tiny", 4, 2) << "  lr: 0.0123\n";
  for (const std::string& command : {sweep, sweep_command(tmp.path(), "1,2", out, shell_quote(config)) +
                                                " --set train.warmup_steps=2"}) {
    const auto changed = run_command(command);
    EXPECT_EQ(changed.exit_code, 2) << changed.out;
    EXPECT_NE(changed.out.find("tiny-sweep/seed1 was trained with other settings than " + config), std::string::npos)
        << changed.out;
  }
  const auto changed = run_command(sweep);
  EXPECT_NE(changed.out.find("(run: lr: 0.001; now: lr: 0.0123)"), std::string::npos) << changed.out;
  EXPECT_EQ(read_file(seed1 / "results.json"), results1);
}

// SIGTERM to the sweep's whole process group, as `kill -- -PGID` or a batch
// system's cancel sends it: the workers get it too, and must still wait for the
// training, which checkpoints, and count it as interrupted (they used to die
// first and report it "not started"). A rerun resumes it.
TEST(Sweep, ATermToTheProcessGroupCountsTheRunningTrainingAsInterrupted) {
  cqk::testing::TempDir tmp("cqk-sweep-term");
  fs::create_directories(tmp / "tiny");
  const std::string config = tmp / "tiny/long.yaml";
  std::ofstream(config) << tiny_sweep_config("sweep-long", 1000000, 1000000);
  const std::string out = tmp / "sweep";
  const fs::path run = fs::path(out) / "tiny-long" / "seed1";
  // setsid: the sweep leads a process group of its own (its workers and trainings inherit it).
  // Whatever happens, the group goes at the end, so that a failure leaves no training running.
  const std::string script =
      "setsid bash -c " + shell_quote(sweep_command(tmp.path(), "1", out, shell_quote(config))) + " >" +
      shell_quote(tmp / "sweep.out") + " 2>&1 & pid=$!\n" + "trap 'kill -KILL -- -$pid 2>/dev/null' EXIT\n" +
      "for i in $(seq 600); do grep -q '\"step\":2' " + shell_quote((run / "metrics.jsonl").string()) +
      " 2>/dev/null && break; sleep 0.1; done\n" + "kill -TERM -- -$pid\n" +
      "for i in $(seq 1200); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done\nwait $pid\n"
      "echo \"sweep exit $?\"\n";
  const auto r = run_command("bash -c " + shell_quote(script));
  const std::string sweep_out = read_file(tmp / "sweep.out");
  EXPECT_NE(r.out.find("sweep exit 1"), std::string::npos) << r.out << sweep_out;
  EXPECT_NE(sweep_out.find("done: 0 finished, 0 already finished, 0 paused, 1 interrupted, 0 diverged, 0 failed, 0 "
                           "not started"),
            std::string::npos)
      << sweep_out;
  EXPECT_NE(read_file(run / "sweep.log").find("interrupted at step"), std::string::npos) << read_file(run / "sweep.log");
  ASSERT_FALSE(fs::exists(run / "results.json"));
  const auto dry = run_command(sweep_command(tmp.path(), "1", out, shell_quote(config)) + " --dry-run");
  EXPECT_NE(dry.out.find("resume tiny-long seed 1"), std::string::npos) << dry.out;
}

// scripts/plot_runs.py on `runs` writes each of `pngs` into `folder` (skipped
// without the Python that has matplotlib).
void expect_plots(const std::string& runs, const std::string& folder, const std::vector<std::string>& pngs) {
  const std::string python = CQK_PYTHON;
  if (python.empty() || ::access(python.c_str(), X_OK) != 0) GTEST_SKIP() << "no Python with matplotlib for the plots";
  const auto plots = run_command(shell_quote(python) + " " +
                                 shell_quote(std::string(CQK_SOURCE_DIR) + "/scripts/plot_runs.py") + " " +
                                 shell_quote(runs) + " --out " + shell_quote(folder));
  ASSERT_EQ(plots.exit_code, 0) << plots.out;
  for (const auto& png : pngs) {
    const std::string bytes = read_file(folder + "/" + png);
    ASSERT_GT(bytes.size(), 1000u) << png;
    EXPECT_EQ(bytes.substr(1, 3), "PNG") << png;
  }
}

// What a researcher runs: two variants (a base and its coupled twin) x three
// seeds through sweep.sh, the statistics it ends with, and the plots.
TEST(Sweep, TwoVariantsThreeSeedsThroughStatsAndPlots) {
  cqk::testing::TempDir tmp("cqk-sweep-grid");
  fs::create_directories(tmp / "tiny");
  const std::string base = tmp / "tiny/grid.yaml", coupled = tmp / "tiny/grid-affine.yaml";
  std::ofstream(base) << tiny_sweep_config("grid", 6, 100);
  std::ofstream(coupled) << "inherit: grid.yaml\nrun:\n  name: grid-affine\nmodel:\n  attention:\n    coupling:\n"
                            "      kind: affine\n";
  const std::string out = tmp / "sweep";
  // Two CPU runs at a time, as the real-text study runs on two cores.
  const auto sweep = run_command(sweep_command(tmp.path(), "1-3", out, shell_quote(base) + " " + shell_quote(coupled)) +
                                 " --cpu-jobs 2");
  ASSERT_EQ(sweep.exit_code, 0) << sweep.out;
  EXPECT_NE(sweep.out.find("6 runs (2 configs x 3 seeds) in " + out + " on the CPU, 2 at a time"), std::string::npos)
      << sweep.out;
  EXPECT_NE(sweep.out.find("6 finished, 0 already finished"), std::string::npos) << sweep.out;
  // Progress: each job's index when it starts; done counts, and the time left, as jobs end.
  EXPECT_NE(sweep.out.find("(run 6/6; log: "), std::string::npos) << sweep.out;
  EXPECT_NE(sweep.out.find(" | 1/6 done, eta "), std::string::npos) << sweep.out;
  EXPECT_NE(sweep.out.find(" | 6/6 done\n"), std::string::npos) << sweep.out;

  // stats.csv: one row per variant with three seeds, and the automatic pair.
  const std::string csv = read_file(fs::path(out) / "stats.csv");
  const std::string md = read_file(fs::path(out) / "stats.md");
  for (const char* variant : {"grid", "grid-affine"}) {
    EXPECT_NE(csv.find(std::string("variant,") + variant + ",,test_ppl,3,"), std::string::npos) << csv;
  }
  EXPECT_NE(md.find("| grid-affine | grid | 3 vs 3 |"), std::string::npos) << md;
  EXPECT_NE(csv.find("comparison,grid-affine,grid,"), std::string::npos) << csv;
  // Three different seeds give three different results: a real spread, not a copy.
  std::set<std::string> losses;
  for (int seed = 1; seed <= 3; ++seed) {
    const std::string results = read_file(fs::path(out) / "tiny-grid-affine" / ("seed" + std::to_string(seed)) /
                                          "results.json");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(results, m, std::regex(R"("valid_ppl": ?([0-9.eE+-]+))"))) << results;
    losses.insert(m[1]);
  }
  EXPECT_EQ(losses.size(), 3u);

  expect_plots(out, tmp / "plots", {"loss_vs_tokens.png", "ppl_bars.png"});
}

// Issue 24's chain on text the test generates: tokenizer -> encode -> two
// variants (uncoupled and affine) x two seeds through sweep.sh, each run also
// evaluated on other text (--eval) -> cqk stats on bits per byte -> plots.
TEST(Sweep, TextFromTheTokenizerToBitsPerByteStatsAndPlots) {
  cqk::testing::TempDir tmp("cqk-sweep-text");
  const std::vector<std::string> words{"red", "river", "garden", "engine", "watches", "old", "clock", "near", "paints"};
  fs::create_directories(tmp / "corpus");
  cqk::testing::write_file(tmp / "corpus/train.txt", cqk::testing::grammar_text(words, 1, 1500));
  cqk::testing::write_file(tmp / "corpus/valid.txt", cqk::testing::grammar_text(words, 2, 150));
  cqk::testing::write_file(tmp / "corpus/test.txt", cqk::testing::grammar_text(words, 3, 150));
  const std::string tool = shell_quote(CQK_TOOL);
  const auto tokenizer = run_command(tool + " data tokenizer --input " + shell_quote(tmp / "corpus/train.txt") +
                                     " --vocab-size 300 --out " + shell_quote(tmp / "tokens/tokenizer.model"));
  ASSERT_EQ(tokenizer.exit_code, 0) << tokenizer.out;
  const auto encode = run_command(tool + " data encode --input " + shell_quote(tmp / "corpus") + " --tokenizer " +
                                  shell_quote(tmp / "tokens/tokenizer.model") + " --out " + shell_quote(tmp / "tokens"));
  ASSERT_EQ(encode.exit_code, 0) << encode.out;
  cqk::testing::write_file(tmp / "ood.txt", cqk::testing::grammar_text({"blue", "river", "lamp", "clock"}, 4, 60));
  const auto ood = run_command(tool + " data encode --input " + shell_quote(tmp / "ood.txt") + " --tokenizer " +
                               shell_quote(tmp / "tokens/tokenizer.model") + " --out " + shell_quote(tmp / "ood"));
  ASSERT_EQ(ood.exit_code, 0) << ood.out;

  fs::create_directories(tmp / "text");
  std::ofstream(tmp / "text/base.yaml") << "run:\n  name: text\nmodel:\n  width: 32\n  layers: 1\n  heads: 2\n"
                                           "data:\n  kind: tokens\n  dir: " << tmp / "tokens" << "\n"
                                           "  seq_len: 32\n  batch_size: 8\n  prefetch: 0\n"
                                           "train:\n  steps: 30\n  warmup_steps: 3\n  eval_every: 15\n"
                                           "  eval_batches: 2\n  log_every: 5\n  checkpoint_every: 100\n"
                                           "  device: cpu\n  threads: 1\n";
  std::ofstream(tmp / "text/affine.yaml") << "inherit: base.yaml\nrun:\n  name: text-affine\nmodel:\n  attention:\n"
                                             "    coupling:\n      kind: affine\n";
  const std::string out = tmp / "sweep";
  const std::string configs_and_eval = shell_quote(tmp / "text/base.yaml") + " " + shell_quote(tmp / "text/affine.yaml") +
                                       " --eval ood=" + shell_quote(tmp / "ood") + " --metric ood_bpb";
  const auto sweep = run_command(sweep_command(tmp.path(), "1-2", out, configs_and_eval));
  ASSERT_EQ(sweep.exit_code, 0) << sweep.out;
  EXPECT_NE(sweep.out.find("4 finished, 0 already finished"), std::string::npos) << sweep.out;
  EXPECT_NE(sweep.out.find("0 not started; 0 evaluations failed"), std::string::npos) << sweep.out;
  // Every run evaluated on the other text at its final step; the sweep's statistics on that.
  for (const auto* run : {"text-base/seed1", "text-base/seed2", "text-affine/seed1", "text-affine/seed2"}) {
    const auto saved = nlohmann::json::parse(read_file(fs::path(out) / run / "evals/ood.json"));
    EXPECT_EQ(saved["step"], 30) << run;
    EXPECT_EQ(saved["data"], tmp / "ood") << run;
    EXPECT_GT(saved["bpb"].get<double>(), 0) << run;
  }
  EXPECT_NE(sweep.out.find("## Comparisons on ood_bpb"), std::string::npos) << sweep.out;
  EXPECT_NE(read_file(fs::path(out) / "stats.csv").find("comparison,text-affine,text,ood_bpb,2,2,"), std::string::npos);
  // Run again: finished runs are skipped, and only the one that lost its evaluation is evaluated again.
  fs::remove(fs::path(out) / "text-base/seed1/evals/ood.json");
  const auto again = run_command(sweep_command(tmp.path(), "1-2", out, configs_and_eval));
  ASSERT_EQ(again.exit_code, 0) << again.out;
  EXPECT_EQ(count_of(again.out, "eval   "), 1) << again.out;
  EXPECT_NE(again.out.find("eval   text-base seed 1 on ood"), std::string::npos) << again.out;
  EXPECT_TRUE(fs::exists(fs::path(out) / "text-base/seed1/evals/ood.json"));

  // The mean bits per byte of each variant, from its runs' results.json.
  std::map<std::string, double> mean_bpb;
  for (const auto& [tag, name] : {std::pair{"text-base", "text"}, std::pair{"text-affine", "text-affine"}}) {
    for (const int seed : {1, 2}) {
      const auto results = nlohmann::json::parse(
          read_file(fs::path(out) / tag / ("seed" + std::to_string(seed)) / "results.json"));
      ASSERT_EQ(results["name"], name);
      mean_bpb[name] += results["valid"]["bpb"].get<double>() / 2;
    }
  }
  const std::string csv_path = tmp / "bpb.csv";
  const auto stats = run_command(tool + " stats " + shell_quote(out) + " --metric valid_bpb --csv " + shell_quote(csv_path));
  ASSERT_EQ(stats.exit_code, 0) << stats.out;
  EXPECT_NE(stats.out.find("## Comparisons on valid_bpb"), std::string::npos) << stats.out;
  EXPECT_NE(stats.out.find("| text-affine | text | 2 vs 2 |"), std::string::npos) << stats.out;
  const std::string csv = read_file(csv_path);
  for (const auto& [name, mean] : mean_bpb) {
    const std::string row = "variant," + name + ",,valid_bpb,2,,";
    const auto at = csv.find(row);
    ASSERT_NE(at, std::string::npos) << row << " in\n" << csv;
    EXPECT_NEAR(std::stod(csv.substr(at + row.size())), mean, 1e-9 * mean) << name;
  }
  EXPECT_NE(csv.find("comparison,text-affine,text,valid_bpb,2,2,"), std::string::npos) << csv;
  // The sweep's own table lists the tokenizer-independent metrics too.
  const std::string sweep_csv = read_file(fs::path(out) / "stats.csv");
  for (const char* metric : {"test_bpb", "valid_word_ppl", "test_seen_loss"})
    EXPECT_NE(sweep_csv.find(std::string("variant,text,,") + metric + ",2,"), std::string::npos) << metric << sweep_csv;

  expect_plots(out, tmp / "plots", {"loss_vs_tokens.png", "ppl_bars.png", "bpb_bars.png"});
}

TEST(Sweep, RejectsBadUsage) {
  const std::string script = shell_quote(std::string(CQK_SOURCE_DIR) + "/scripts/sweep.sh");
  EXPECT_EQ(run_command(script).exit_code, 2);
  EXPECT_EQ(run_command(script + " --seeds x " + shell_quote(kGrid.string() + "/60m/vanilla.yaml")).exit_code, 2);
  EXPECT_EQ(run_command(script + " --set run.seed=3 " + shell_quote(kGrid.string() + "/60m/vanilla.yaml")).exit_code, 2);
  EXPECT_EQ(run_command(script + " /no/such/config.yaml").exit_code, 2);
  EXPECT_EQ(run_command(script + " --cpu-jobs 0 " + shell_quote(kGrid.string() + "/60m/vanilla.yaml")).exit_code, 2);
  for (const std::string eval : {"ood", "test=/tmp", "Ood=/tmp", "ood=/no/such/folder"}) {
    const auto bad = run_command(script + " --dry-run --eval " + shell_quote(eval) + " " +
                                 shell_quote(kGrid.string() + "/60m/vanilla.yaml"));
    EXPECT_EQ(bad.exit_code, 2) << eval;
    EXPECT_NE(bad.out.find("sweep: --eval '" + eval + "'"), std::string::npos) << bad.out;
  }
  // A metric cqk stats does not know, or of an evaluation the sweep does not make, stops it before it trains.
  const std::string with_tool = "CQK_BIN=" + shell_quote(CQK_TOOL) + " " + script + " --dry-run --metric ";
  const auto unknown = run_command(with_tool + "test_bpbb " + shell_quote(kGrid.string() + "/60m/vanilla.yaml"));
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.out.find("sweep: --metric: unknown metric 'test_bpbb' (expected EVALUATION_MEASURE"),
            std::string::npos)
      << unknown.out;
  cqk::testing::TempDir ood("cqk-sweep-metric");
  std::ofstream(ood / "valid.bin") << "";
  const auto no_eval = run_command(with_tool + "wt2_bpb --eval ood=" + shell_quote(ood.path()) + " " +
                                   shell_quote(kGrid.string() + "/60m/vanilla.yaml"));
  EXPECT_EQ(no_eval.exit_code, 2);
  EXPECT_NE(no_eval.out.find("sweep: --metric 'wt2_bpb': wt2 is neither valid, test nor the NAME of an --eval"),
            std::string::npos)
      << no_eval.out;
  EXPECT_EQ(run_command(with_tool + "test_error " + shell_quote(kGrid.string() + "/60m/vanilla.yaml")).exit_code, 0);
  // --compare names that no config of the sweep has stop it before it trains.
  const std::string grid60 = shell_quote(kGrid.string() + "/60m/vanilla.yaml") + " " +
                             shell_quote(kGrid.string() + "/60m/vanilla-affine.yaml");
  const std::string compare = "CQK_BIN=" + shell_quote(CQK_TOOL) + " " + script + " --dry-run --out " +
                              shell_quote(::testing::TempDir() + "cqk-sweep-compare") + " --compare ";
  const auto typo = run_command(compare + "60m-vanilla-afine:60m-vanilla " + grid60);
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_NE(typo.out.find("sweep: --compare '60m-vanilla-afine:60m-vanilla': no config of this sweep and no run in "),
            std::string::npos)
      << typo.out;
  EXPECT_EQ(run_command(compare + "60m-vanilla-affine:60m-vanilla " + grid60).exit_code, 0);

  // Two configs that would share a run folder.
  cqk::testing::TempDir tmp("cqk-sweep-usage");
  fs::create_directories(tmp / "a/x");
  fs::create_directories(tmp / "b/x");
  std::ofstream(tmp / "a/x/c.yaml") << "run: {name: a}\n";
  std::ofstream(tmp / "b/x/c.yaml") << "run: {name: b}\n";
  const auto clash = run_command(script + " --dry-run " + shell_quote(tmp / "a/x/c.yaml") + " " + shell_quote(tmp / "b/x/c.yaml"));
  EXPECT_EQ(clash.exit_code, 2);
  EXPECT_NE(clash.out.find("both map to run folder"), std::string::npos) << clash.out;

  // Two configs of one run.name, which cqk stats would pool as one variant; and a --set of run.name.
  std::ofstream(tmp / "a/x/low.yaml") << "run: {name: lr}\ntrain: {lr: 1.0e-3}\n";
  std::ofstream(tmp / "a/x/high.yaml") << "run: {name: lr}\ntrain: {lr: 3.0e-3}\n";
  const auto pooled = run_command("CQK_BIN=" + shell_quote(CQK_TOOL) + " " + script + " --dry-run " +
                                  shell_quote(tmp / "a/x/low.yaml") + " " + shell_quote(tmp / "a/x/high.yaml"));
  EXPECT_EQ(pooled.exit_code, 2);
  EXPECT_NE(pooled.out.find("both have run.name 'lr'"), std::string::npos) << pooled.out;
  EXPECT_EQ(run_command(script + " --dry-run --set run.name=x " + shell_quote(tmp / "a/x/low.yaml")).exit_code, 2);
}

TEST(Sweep, DryRunListsTheGridOfAScale) {
  const auto dry = run_command("CUDA_VISIBLE_DEVICES= " + shell_quote(std::string(CQK_SOURCE_DIR) + "/scripts/sweep.sh") +
                         " --dry-run --seeds 1-3 --out /nonexistent/sweep " + shell_quote((kGrid / "150m").string()));
  ASSERT_EQ(dry.exit_code, 0) << dry.out;
  EXPECT_NE(dry.out.find("42 runs (14 configs x 3 seeds)"), std::string::npos) << dry.out;
  EXPECT_NE(dry.out.find("150m-diff-affine seed 3"), std::string::npos) << dry.out;
  EXPECT_EQ(dry.out.find("150m-base"), std::string::npos) << dry.out;
  // Seeds outer: every variant's seed 1 comes before any seed 2, so a sweep cut short stays paired.
  EXPECT_LT(dry.out.rfind(" seed 1: "), dry.out.find(" seed 2: ")) << dry.out;
}

}  // namespace
