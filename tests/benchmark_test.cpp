#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/benchmark.h"
#include "temp_dir.h"
#include "test_io.h"

// `cqk bench train` end to end (no timing assertions: the fields exist and are
// sane), and the check that scripts/bench_pytorch.py computes the same function
// as cqk: the loss of the same weights on the same batch agrees to 1e-5.
namespace {

using cqk::testing::read_file;
using cqk::testing::run_command;
using cqk::testing::shell_quote;
using cqk::testing::TempDir;
using nlohmann::json;

// The last non-empty line, parsed as JSON (an object with "error" when it is not JSON).
json last_json_line(const std::string& output) {
  std::string line;
  size_t end = output.find_last_not_of("\n ");
  if (end == std::string::npos) return json{{"error", "no output"}};
  const size_t start = output.rfind('\n', end);
  line = output.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
  try {
    return json::parse(line);
  } catch (const json::exception&) {
    return json{{"error", "not JSON: " + line}};
  }
}

const std::string kTool = CQK_TOOL;
const std::string kSource = CQK_SOURCE_DIR;
// A small and quick variant of the tiny benchmark config, one thread (ctest may run tests side by side).
const std::string kQuick =
    " --set data.batch_size=4 --set data.recall.train_examples=64 --set data.recall.eval_examples=8"
    " --set train.threads=1 --peak-size 128";

std::string python() {
  const std::string path = CQK_PYTHON;
  return path.empty() || ::access(path.c_str(), X_OK) != 0 ? std::string() : path;
}

TEST(Benchmark, SpreadOfSample) {
  const auto s = cqk::spread_of({4.0, 1.0, 3.0, 2.0, 5.0});
  EXPECT_DOUBLE_EQ(s.median, 3.0);
  EXPECT_DOUBLE_EQ(s.min, 1.0);
  EXPECT_DOUBLE_EQ(s.max, 5.0);
  EXPECT_DOUBLE_EQ(s.p25, 2.0);
  EXPECT_DOUBLE_EQ(s.p75, 4.0);
  EXPECT_DOUBLE_EQ(s.mean, 3.0);
  const auto even = cqk::spread_of({1.0, 2.0});
  EXPECT_DOUBLE_EQ(even.median, 1.5);
  EXPECT_DOUBLE_EQ(cqk::spread_of({}).median, 0.0);
}

TEST(Benchmark, DatasheetPeakOnlyForKnownGpus) {
  std::string source;
  EXPECT_DOUBLE_EQ(cqk::datasheet_peak_flops("NVIDIA H200", "bf16", &source).value_or(0), 989e12);
  EXPECT_NE(source.find("datasheet"), std::string::npos);
  EXPECT_DOUBLE_EQ(cqk::datasheet_peak_flops("NVIDIA H100 80GB HBM3", "bf16").value_or(0), 989e12);
  EXPECT_FALSE(cqk::datasheet_peak_flops("NVIDIA H100 PCIe", "bf16").has_value());
  EXPECT_FALSE(cqk::datasheet_peak_flops("AMD EPYC", "fp32").has_value());
  EXPECT_GT(cqk::peak_rss_bytes(), 0);
}

TEST(Benchmark, TrainJsonHasEveryField) {
  const auto r = run_command(kTool + " bench train " + kSource + "/configs/bench/tiny.yaml --warmup 1 --steps 2 --json" + kQuick);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const json j = last_json_line(r.out);
  ASSERT_FALSE(j.contains("error")) << r.out;
  for (const char* key : {"name", "device", "device_name", "dtype", "threads", "torch_version", "params",
                          "coupling_params", "tokens_per_step", "step_seconds", "step_time_s", "tokens_per_s",
                          "tokens_per_s_mean", "peak_rss_bytes", "cuda_peak_bytes", "other_cpu_load", "flops_per_token",
                          "flops_counting", "achieved_flops", "measured_peak_flops", "mfu_measured",
                          "datasheet_peak_flops", "mfu_datasheet", "first_loss", "last_loss", "config"})
    EXPECT_TRUE(j.contains(key)) << key << " missing in " << r.out;
  for (const char* key : {"median", "min", "max", "p25", "p75", "mean"})
    EXPECT_TRUE(j["step_time_s"].contains(key)) << key;
  EXPECT_EQ(j["name"], "bench-tiny");
  EXPECT_EQ(j["threads"], 1);
  EXPECT_EQ(j["tokens_per_step"], 4 * 64);
  EXPECT_EQ(j["step_seconds"].size(), 2u);
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["peak_rss_bytes"].get<int64_t>(), 0);
  EXPECT_GT(j["measured_peak_flops"].get<double>(), 0.0);
  EXPECT_GT(j["mfu_measured"].get<double>(), 0.0);
  EXPECT_LE(j["step_time_s"]["min"].get<double>(), j["step_time_s"]["median"].get<double>());
  EXPECT_LE(j["step_time_s"]["median"].get<double>(), j["step_time_s"]["max"].get<double>());
  // 6 N + 12 L d T with the default model: L = 2, d = 128, T = 64.
  EXPECT_DOUBLE_EQ(j["flops_per_token"].get<double>(), 6.0 * j["params"].get<double>() + 12.0 * 2 * 128 * 64);
  EXPECT_EQ(j["config"]["model"]["vocab_size"], 128);  // resolved from the data
  if (j["device"] == "cpu") {
    EXPECT_TRUE(j["cuda_peak_bytes"].is_null());
    EXPECT_TRUE(j["mfu_datasheet"].is_null());
  }
}

TEST(Benchmark, TextOutputAndBadArguments) {
  const auto r = run_command(kTool + " bench train " + kSource + "/configs/bench/tiny.yaml --warmup 0 --steps 1" + kQuick);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MFU"), std::string::npos) << r.out;
  const auto bad = run_command(kTool + " bench train " + kSource + "/configs/bench/tiny.yaml --steps 0");
  EXPECT_NE(bad.exit_code, 0) << bad.out;
  const auto missing = run_command(kTool + " bench train /nonexistent.yaml");
  EXPECT_NE(missing.exit_code, 0) << missing.out;
  EXPECT_NE(missing.out.find("cqk: error"), std::string::npos) << missing.out;
}

// --profile: after the timing, a Chrome trace of a few more steps in ./profile/, and the table.
TEST(Benchmark, ProfileWritesATraceAndTheTable) {
  TempDir dir("cqk-bench");
  const auto r = run_command("cd " + shell_quote(dir.path()) + " && " + kTool + " bench train " + kSource +
                             "/configs/bench/tiny.yaml --warmup 0 --steps 1 --profile" + kQuick);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("by cqk range"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cqk::attention"), std::string::npos) << r.out;
  const auto trace = json::parse(read_file(dir / "profile/bench-tiny-bench.json"));
  int steps = 0;
  for (const auto& event : trace.at("traceEvents")) steps += event.value("name", std::string()) == "cqk::step";
  EXPECT_EQ(steps, cqk::kProfiledBenchSteps);
  const auto both = run_command(kTool + " bench train " + kSource + "/configs/bench/tiny.yaml --profile --compare " +
                                kSource + "/configs/bench/tiny.yaml");
  EXPECT_NE(both.exit_code, 0) << both.out;
}

// cqk's loss and bench_pytorch.py's loss of the dumped weights on the dumped batch.
void expect_same_loss(const std::string& config, int warmup, bool expect_same_init) {
  const std::string py = python();
  TempDir dir("cqk-bench");
  const auto dump = dir / "dump";
  const auto r = run_command(kTool + " bench train " + kSource + "/configs/" + config + " --warmup " + std::to_string(warmup) +
                     " --steps 1 --json --dump " + dump + kQuick);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto check = run_command(py + " " + kSource + "/scripts/bench_pytorch.py --check-loss " + dump + " --threads 1");
  const json j = last_json_line(check.out);
  ASSERT_FALSE(j.contains("error")) << check.out;
  EXPECT_EQ(check.exit_code, 0) << check.out;
  EXPECT_LE(j["abs_diff"].get<double>(), 1e-5) << check.out;
  EXPECT_GT(j["loss_cqk"].get<double>(), 0.0) << check.out;
  if (expect_same_init) {
    // Same seed, the same draw per parameter name: Python's own initialisation is cqk's.
    ASSERT_TRUE(j.contains("init_max_abs_diff")) << check.out;
    EXPECT_EQ(j["init_max_abs_diff"].get<double>(), 0.0) << check.out;
  }
}

TEST(Benchmark, PyTorchReferenceHasTheSameInitialLoss) {
  if (python().empty()) GTEST_SKIP() << "no torch Python (CQK_PYTHON='" << CQK_PYTHON << "')";
  expect_same_loss("bench/tiny.yaml", 0, true);
  expect_same_loss("tiny/recall-diff-affine.yaml", 0, true);
  expect_same_loss("tiny/recall-diff-affine.yaml --set model.attention.head_norm_init=0.25", 0, true);
}

// After two optimizer steps the coupling's output layers are no longer zero,
// so the coupled map itself is compared too.
TEST(Benchmark, PyTorchReferenceHasTheSameLossAfterTraining) {
  if (python().empty()) GTEST_SKIP() << "no torch Python (CQK_PYTHON='" << CQK_PYTHON << "')";
  expect_same_loss("bench/tiny.yaml", 2, false);
  expect_same_loss("tiny/recall-diff-affine.yaml", 2, false);
}

// bench_pytorch.py optimises with the trainer's own parameter groups, read
// from the dump: on a config that trains the coupling at 10x the lr without
// weight decay (configs/cpu/vanilla-affine-lr10.yaml, on the recall task so
// that no corpus is needed), every parameter gets cqk's lr and weight decay.
TEST(Benchmark, PyTorchReferenceOptimisesWithTheTrainersGroups) {
  if (python().empty()) GTEST_SKIP() << "no torch Python (CQK_PYTHON='" << CQK_PYTHON << "')";
  TempDir dir("cqk-bench-groups");
  const auto dump = dir / "dump";
  const auto r = run_command(kTool + " bench train " + kSource +
                             "/configs/cpu/vanilla-affine-lr10.yaml --set data.kind=recall --warmup 0 --steps 1 --dump " +
                             dump + kQuick);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const json groups = json::parse(read_file(dump + "/optimizer.json"));
  const double lr = json::parse(read_file(dump + "/config.json"))["train"]["lr"].get<double>();
  std::map<std::string, std::pair<double, double>> cqk;  // name -> (lr, weight decay)
  int coupling = 0;
  for (const auto& g : groups) {
    for (const auto& name : g["params"]) {
      const bool in_coupling = name.get<std::string>().find(".coupling.") != std::string::npos;
      coupling += in_coupling;
      EXPECT_EQ(g["lr_scale"].get<double>(), in_coupling ? 10.0 : 1.0) << name;
      if (in_coupling) EXPECT_EQ(g["weight_decay"].get<double>(), 0.0) << name;
      cqk[name] = {lr * g["lr_scale"].get<double>(), g["weight_decay"].get<double>()};
    }
  }
  EXPECT_GT(coupling, 0);
  const std::string script = "import argparse, json, sys; sys.path.insert(0, '" + kSource + "/scripts'); "
                             "import bench_pytorch as b; "
                             "a = argparse.Namespace(dump='" + dump + "', config=None, check_loss=None); "
                             "c = b.read_config(a); m = b.TransformerLM(c['model']); "
                             "o = b.make_optimizer(m, c['train'], b.read_optimizer_groups(a)); "
                             "n = {id(p): k for k, p in m.named_parameters()}; "
                             "print(json.dumps({n[id(p)]: [g['lr'], g['weight_decay']] "
                             "for g in o.param_groups for p in g['params']}))";
  const auto py = run_command(python() + " -c " + shell_quote(script));
  ASSERT_EQ(py.exit_code, 0) << py.out;
  const json torch_groups = last_json_line(py.out);
  ASSERT_EQ(torch_groups.size(), cqk.size()) << py.out;
  for (const auto& [name, lr_decay] : cqk) {
    ASSERT_TRUE(torch_groups.contains(name)) << name;
    EXPECT_DOUBLE_EQ(torch_groups[name][0].get<double>(), lr_decay.first) << name;
    EXPECT_DOUBLE_EQ(torch_groups[name][1].get<double>(), lr_decay.second) << name;
  }
}

}  // namespace
