#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cqk/config_loader.h"
#include "cqk/parameter_count.h"
#include "temp_dir.h"

// The paper's grid in configs/wikitext103: every file loads, its model is within
// 5% of the scale in its path, run names are unique and match the files; and
// scripts/sweep.sh end to end on a tiny config (skip, resume, stats).
namespace {

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
    EXPECT_EQ(f.config.data.kind, "tokens");
    EXPECT_EQ(f.config.data.dir, "data/wikitext-103/tokens");
    EXPECT_EQ(f.config.train.device, "auto");
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
        EXPECT_EQ(c->model.attention.kind, attention);
        EXPECT_EQ(c->model.attention.coupling.kind, coupling);
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
      EXPECT_EQ(c->model.attention.kind, attention);
      EXPECT_EQ(c->model.attention.coupling.kind, control);
      // Controls are capacity-matched to the method within 5% (DESIGN.md).
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
      EXPECT_EQ(c->model.attention.kind, "diff");
      EXPECT_EQ(c->model.attention.coupling.kind, variant == "diff" ? "none" : "affine");
    }
  }
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

struct Shell {
  int status = -1;
  std::string output;
};

Shell shell(const std::string& command) {
  Shell result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) result.output += buffer;
  const int status = ::pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int count_of(const std::string& text, const std::string& needle) {
  int n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(Sweep, TrainsSkipsFinishedRunsAndResumesPausedOnes) {
  cqk::testing::TempDir tmp("cqk-sweep-test");
  // The config lives in tiny/sweep.yaml, so the sweep's folder for it is tiny-sweep.
  fs::create_directories(tmp / "tiny");
  const std::string config = tmp / "tiny/sweep.yaml";
  std::ofstream(config) << "inherit: " << CQK_SOURCE_DIR << "/configs/tiny/recall-vanilla.yaml\n"
                        << R"(run:
  name: sweep-tiny
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
  steps: 4
  warmup_steps: 1
  eval_every: 100          # never before the final evaluation
  log_every: 1
  checkpoint_every: 2
  device: cpu
  threads: 1
)";
  const std::string out = tmp / "sweep";
  const std::string tool = CQK_TOOL;
  // CUDA_VISIBLE_DEVICES= (empty): no GPU is visible, jobs run one at a time on the CPU.
  const std::string sweep = "cd " + quote(tmp.path()) + " && CUDA_VISIBLE_DEVICES= CQK_BIN=" + quote(tool) + " " +
                            quote(std::string(CQK_SOURCE_DIR) + "/scripts/sweep.sh") + " --seeds 1,2 --out " +
                            quote(out) + " " + quote(config);
  const fs::path seed1 = fs::path(out) / "tiny-sweep" / "seed1", seed2 = fs::path(out) / "tiny-sweep" / "seed2";

  // An interrupted run of seed 2: two of its four steps, with a checkpoint.
  const auto paused = shell(quote(tool) + " train " + quote(config) + " --set run.seed=2 --run-dir " +
                            quote(seed2.string()) + " --max-steps 2");
  ASSERT_EQ(paused.status, 0) << paused.output;
  ASSERT_FALSE(fs::exists(seed2 / "results.json"));

  const auto dry = shell(sweep + " --dry-run");
  ASSERT_EQ(dry.status, 0) << dry.output;
  EXPECT_NE(dry.output.find("train tiny-sweep seed 1"), std::string::npos) << dry.output;
  EXPECT_NE(dry.output.find("resume tiny-sweep seed 2"), std::string::npos) << dry.output;

  const auto first = shell(sweep);
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_NE(first.output.find("train  tiny-sweep seed 1"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("resume tiny-sweep seed 2"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("2 finished, 0 already finished"), std::string::npos) << first.output;
  ASSERT_TRUE(fs::exists(seed1 / "results.json")) << read_text(seed1 / "sweep.log");
  ASSERT_TRUE(fs::exists(seed2 / "results.json")) << read_text(seed2 / "sweep.log");
  const std::string seed2_log = read_text(seed2 / "sweep.log");
  EXPECT_NE(seed2_log.find("--resume"), std::string::npos) << seed2_log;
  EXPECT_NE(seed2_log.find("resumed from"), std::string::npos) << seed2_log;
  EXPECT_NE(read_text(seed2 / "results.json").find("\"seed\": 2"), std::string::npos);
  EXPECT_NE(read_text(seed1 / "results.json").find("\"steps\": 4"), std::string::npos);
  // cqk stats ran on the sweep folder: one variant, two seeds.
  EXPECT_NE(first.output.find("sweep-tiny"), std::string::npos) << first.output;
  EXPECT_TRUE(fs::exists(fs::path(out) / "stats.md"));
  EXPECT_TRUE(fs::exists(fs::path(out) / "stats.csv"));

  const auto results1 = read_text(seed1 / "results.json"), results2 = read_text(seed2 / "results.json");
  const auto log1 = read_text(seed1 / "sweep.log");
  const auto second = shell(sweep);
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_EQ(count_of(second.output, "skip   tiny-sweep seed"), 2) << second.output;
  EXPECT_NE(second.output.find("0 finished, 2 already finished"), std::string::npos) << second.output;
  EXPECT_EQ(read_text(seed1 / "results.json"), results1);
  EXPECT_EQ(read_text(seed2 / "results.json"), results2);
  EXPECT_EQ(read_text(seed1 / "sweep.log"), log1) << "a finished run was started again";
}

TEST(Sweep, RejectsBadUsage) {
  const std::string script = quote(std::string(CQK_SOURCE_DIR) + "/scripts/sweep.sh");
  EXPECT_EQ(shell(script).status, 2);
  EXPECT_EQ(shell(script + " --seeds x " + quote(kGrid.string() + "/60m/vanilla.yaml")).status, 2);
  EXPECT_EQ(shell(script + " --set run.seed=3 " + quote(kGrid.string() + "/60m/vanilla.yaml")).status, 2);
  EXPECT_EQ(shell(script + " /no/such/config.yaml").status, 2);
  // Two configs that would share a run folder.
  cqk::testing::TempDir tmp("cqk-sweep-usage");
  fs::create_directories(tmp / "a/x");
  fs::create_directories(tmp / "b/x");
  std::ofstream(tmp / "a/x/c.yaml") << "run: {name: a}\n";
  std::ofstream(tmp / "b/x/c.yaml") << "run: {name: b}\n";
  const auto clash = shell(script + " --dry-run " + quote(tmp / "a/x/c.yaml") + " " + quote(tmp / "b/x/c.yaml"));
  EXPECT_EQ(clash.status, 2);
  EXPECT_NE(clash.output.find("both map to run folder"), std::string::npos) << clash.output;
}

TEST(Sweep, DryRunListsTheGridOfAScale) {
  const auto dry = shell("CUDA_VISIBLE_DEVICES= " + quote(std::string(CQK_SOURCE_DIR) + "/scripts/sweep.sh") +
                         " --dry-run --seeds 1-3 --out /nonexistent/sweep " + quote((kGrid / "150m").string()));
  ASSERT_EQ(dry.status, 0) << dry.output;
  EXPECT_NE(dry.output.find("42 runs (14 configs x 3 seeds)"), std::string::npos) << dry.output;
  EXPECT_NE(dry.output.find("150m-diff-affine seed 3"), std::string::npos) << dry.output;
  EXPECT_EQ(dry.output.find("150m-base"), std::string::npos) << dry.output;
}

}  // namespace
