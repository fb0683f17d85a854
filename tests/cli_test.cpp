#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>

#include "cqk/sampling.h"
#include "temp_dir.h"
#include "test_io.h"

// The `cqk` tool end to end (train, eval, generate, inspect, error reporting)
// on one tiny recall run trained once for the suite, and the sampler behind
// `cqk generate`.
namespace {

using cqk::testing::CommandResult;
using cqk::testing::read_file;
using cqk::testing::run_command;

// Runs `cqk <args>` with stdout and stderr kept apart.
CommandResult run_tool(const std::string& args, const std::string& scratch) {
  return run_command(std::string(CQK_TOOL) + " " + args, scratch + "/stderr.txt");
}

// A failing command reports exactly one line "cqk: error: ..." on stderr.
void expect_one_error_line(const CommandResult& r, const std::string& must_contain) {
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.rfind("cqk: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(must_contain), std::string::npos) << "expected '" << must_contain << "' in: " << r.err;
}

double number_after(const std::string& text, const std::string& label) {
  std::smatch match;
  const std::regex pattern(label + " ([0-9.eE+-]+)");
  if (!std::regex_search(text, match, pattern)) throw std::runtime_error("no '" + label + "' in: " + text);
  return std::stod(match[1]);
}

// Trains the tiny recall run (6 steps, checkpoints at 3 and 6) in `dir`/run.
std::string train_tiny_run(const cqk::testing::TempDir& dir) {
  const std::string run = dir / "run";
  const auto r = run_tool(
      "train --set train.steps=6 --set model.width=32 --set model.layers=1 --set data.seq_len=16"
      " --set data.batch_size=4 --set data.recall.pairs=2 --set data.recall.vocab_size=32"
      " --set data.recall.train_examples=100 --set data.recall.eval_examples=16 --set train.eval_every=3"
      " --set train.log_every=3 --set train.checkpoint_every=3 --set train.device=cpu --set run.dir=" +
          run,
      dir.path());
  if (r.exit_code != 0) throw std::runtime_error("cqk train failed: " + r.out + r.err);
  return run;
}

// One test for everything that needs a trained run, so that it trains once
// (ctest runs every test in a process of its own).
TEST(CliTool, EvalAndGenerateOnATrainedRun) {
  cqk::testing::TempDir dir("cqk-cli");
  const std::string run = train_tiny_run(dir);
  const auto tool = [&](const std::string& args) { return run_tool(args, dir.path()); };
  const auto results = nlohmann::json::parse(read_file(run + "/results.json"));

  // eval over the whole split reproduces the final evaluation of training.
  const double valid_ppl = results["valid_ppl"].get<double>();
  const auto text = tool("eval " + run);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NEAR(number_after(text.out, "ppl"), valid_ppl, 1e-6 * valid_ppl) << text.out;
  EXPECT_NEAR(number_after(text.out, "loss"), results["valid"]["loss"].get<double>(), 1e-6) << text.out;
  EXPECT_NE(text.out.find("step-000000006.ckpt"), std::string::npos) << text.out;
  // Progress on stderr, the result alone on stdout.
  EXPECT_NE(text.err.find(" | evaluating valid | eta "), std::string::npos) << text.err;
  EXPECT_EQ(text.out.find("evaluating"), std::string::npos) << text.out;

  const auto test = tool("eval " + run + " --split test --json");
  ASSERT_EQ(test.exit_code, 0) << test.err;
  const auto test_line = nlohmann::json::parse(test.out);
  const double test_ppl = results["test_ppl"].get<double>();
  EXPECT_NEAR(test_line["ppl"].get<double>(), test_ppl, 1e-6 * test_ppl);
  EXPECT_NEAR(test_line["loss"].get<double>(), results["test"]["loss"].get<double>(), 1e-6);
  EXPECT_EQ(test_line["tokens"].get<int64_t>(), results["test"]["tokens"].get<int64_t>());
  EXPECT_EQ(test_line["step"].get<int64_t>(), 6);
  EXPECT_EQ(test_line["split"].get<std::string>(), "test");

  // A checkpoint file instead of the run directory, and a batch limit.
  const auto older = tool("eval " + run + "/checkpoints/step-000000003.ckpt --batches 1 --json");
  ASSERT_EQ(older.exit_code, 0) << older.err;
  const auto older_line = nlohmann::json::parse(older.out);
  EXPECT_EQ(older_line["step"].get<int64_t>(), 3);
  EXPECT_LT(older_line["tokens"].get<int64_t>(), results["valid"]["tokens"].get<int64_t>());
  EXPECT_GT(older_line["ppl"].get<double>(), 1.0);
  // The same checkpoint named from inside its run's checkpoints/ folder: the run is "..".
  const auto inside = run_command("cd '" + run + "/checkpoints' && " + CQK_TOOL +
                                      " eval step-000000003.ckpt --batches 1 --json",
                                  dir / "stderr.txt");
  ASSERT_EQ(inside.exit_code, 0) << inside.err;
  EXPECT_EQ(nlohmann::json::parse(inside.out)["ppl"], older_line["ppl"]);
  expect_one_error_line(tool("eval " + dir / "missing"), "no such run directory or checkpoint");

  // Greedy generation: five ids of the vocabulary, the same every time.
  const std::string greedy = "generate " + run + " --prompt '1 2 3' --tokens 5 --temperature 0";
  const auto first = tool(greedy), second = tool(greedy);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(first.out, second.out);
  std::istringstream ids(first.out);
  int count = 0;
  for (int64_t id; ids >> id; ++count) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 32);
  }
  EXPECT_EQ(count, 5) << first.out;
  // Sampling with a seed repeats too.
  const std::string sampled = "generate " + run + " --prompt 4,5 --tokens 5 --top-k 4 --seed 7";
  const auto sample = tool(sampled);
  ASSERT_EQ(sample.exit_code, 0) << sample.err;
  EXPECT_EQ(sample.out, tool(sampled).out);
  expect_one_error_line(tool("generate " + run + " --prompt '1 99'"), "outside the vocabulary");

  // inspect on the run's resolved config counts the parameters training recorded.
  const auto inspect = tool("inspect " + run + "/config.yaml");
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("(" + std::to_string(results["params"].get<int64_t>()) + ")\n"), std::string::npos)
      << inspect.out;

  // inspect on the run folder: the same model, and its coupling's diagnostics
  // as logged at the evaluation of step 3 and at the end, and for the newest
  // checkpoint per layer (1 layer) on the validation batch the trainer used.
  const auto run_report = tool("inspect " + run);
  ASSERT_EQ(run_report.exit_code, 0) << run_report.err;
  EXPECT_NE(run_report.out.find("(" + std::to_string(results["params"].get<int64_t>()) + ")\n"), std::string::npos)
      << run_report.out;
  const auto logged = run_report.out.find("coupling at each evaluation");
  const auto current = run_report.out.find("coupling per layer at step 6");
  ASSERT_NE(logged, std::string::npos) << run_report.out;
  ASSERT_NE(current, std::string::npos) << run_report.out;
  const auto row = [&](std::size_t from, const std::string& label) {
    std::smatch match;
    const std::string text = run_report.out.substr(from);
    EXPECT_TRUE(std::regex_search(text, match, std::regex("\n *" + label + "((?: +[-0-9.]+){4})\n")))
        << label << " in " << text;
    return match.size() > 1 ? match[1].str() : std::string();
  };
  EXPECT_FALSE(row(logged, "3").empty());
  // The final row of the log and layer 0 now are the same numbers.
  EXPECT_EQ(row(logged, "final"), row(current, "0"));
  expect_one_error_line(tool("inspect " + run + " --yaml"), "apply to configs, not runs");
}

// `cqk recall` over tiny runs (2 pairs, length 12, width 16, 3 steps on the
// CPU); `grid` picks the attention kinds, couplings and seeds.
std::string tiny_recall_study(const std::string& grid) {
  return "--threads 1 recall --pairs 2 --seq-len 12 --width 16 " + grid +
         " --set model.heads=2 --set data.batch_size=4 --set data.prefetch=0 --set data.recall.train_examples=32"
         " --set data.recall.eval_examples=8 --set train.steps=3 --set train.warmup_steps=1 --set train.eval_every=100"
         " --set train.checkpoint_every=100 --set train.device=cpu";
}

// `cqk recall` on a grid of 2 couplings x 2 seeds with tiny runs: the table
// (mean ± sd over seeds), how soon runs solved the task, the per-run CSV, and
// a second call that reuses the finished runs instead of training them again.
TEST(CliTool, RecallStudyTabulatesSeedsAndSkipsFinishedRuns) {
  cqk::testing::TempDir dir("cqk-recall");
  const std::string study =
      tiny_recall_study("--attention vanilla --coupling none,affine --seeds 1,2") + " --out " + dir / "study";
  const auto first = run_tool(study, dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  EXPECT_NE(first.out.find("(2 seeds: mean ± sd, and the seeds that solved it (test accuracy >= 0.95))"),
            std::string::npos)
      << first.out;
  // Seeds outer, so that a study cut short holds whole seeds of every grid point.
  EXPECT_NE(first.err.find("recall run 2/4: p2-t12-d16-vanilla-affine seed 1"), std::string::npos) << first.err;
  const std::string table = read_file(dir / "study/recall_accuracy.md");
  EXPECT_NE(table.find("| pairs | seq_len | width | vanilla+none | vanilla+affine |"), std::string::npos) << table;
  std::smatch cells;
  ASSERT_TRUE(std::regex_search(
      table, cells,
      std::regex(R"(\| 2 \| 12 \| 16 \| [01]\.\d{3} ± \d\.\d{3}, (\d) solved \| [01]\.\d{3} ± \d\.\d{3}, (\d) solved \|)")))
      << table;
  const std::string csv = read_file(dir / "study/recall_accuracy.csv");
  // The solved counts against the CSV's accuracies (the field after the seed).
  for (const auto& [coupling, cell] : {std::pair{"none", 1}, std::pair{"affine", 2}}) {
    int solved = 0;
    for (const char* seed : {"1", "2"}) {
      const std::string row = std::string("2,12,16,vanilla,") + coupling + "," + seed + ",";
      const auto at = csv.find(row);
      ASSERT_NE(at, std::string::npos) << row << " in\n" << csv;
      solved += std::stod(csv.substr(at + row.size())) >= 0.95;
    }
    EXPECT_EQ(std::stoi(cells[cell].str()), solved) << coupling << "\n" << table << csv;
  }
  const auto results = nlohmann::json::parse(read_file(dir / "study/p2-t12-d16-vanilla-affine-seed2/results.json"));
  EXPECT_EQ(results["seed"].get<int64_t>(), 2);
  EXPECT_EQ(results["name"].get<std::string>(), "recall-p2-t12-d16-vanilla-affine");

  const auto second = run_tool(study, dir.path());
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(read_file(dir / "study/recall_accuracy.md"), table);
  EXPECT_EQ(read_file(dir / "study/recall_accuracy.csv"), csv);
  size_t reused = 0;
  for (auto at = second.err.find("(finished before)"); at != std::string::npos;
       at = second.err.find("(finished before)", at + 1))
    ++reused;
  EXPECT_EQ(reused, 4u) << second.err;
  EXPECT_EQ(second.err.find("parameters:"), std::string::npos) << "a finished run was trained again:\n" << second.err;

  // Runs that solved the task (accuracy >= 0.95; three steps are too few, so the results say so) are counted.
  for (const auto& [seed, accuracy] : {std::pair{1, 0.97}, std::pair{2, 0.94}}) {
    const auto file = dir / ("study/p2-t12-d16-vanilla-affine-seed" + std::to_string(seed) + "/results.json");
    auto edited = nlohmann::json::parse(read_file(file));
    edited["test"]["accuracy"] = accuracy;
    std::ofstream(file) << edited.dump();
  }
  // How soon: the first evaluation whose valid accuracy reached 0.95, from metrics.jsonl (a torn line skipped).
  std::ofstream(dir / "study/p2-t12-d16-vanilla-affine-seed1/metrics.jsonl", std::ios::app)
      << R"({"step":1,"valid_accuracy":0.5})" "\n" R"({"step":2,"valid_accuracy":0.96})" "\n" R"({"step":3,"valid_acc)";
  std::ofstream(dir / "study/p2-t12-d16-vanilla-affine-seed2/metrics.jsonl", std::ios::app)
      << R"({"step":1,"valid_accuracy":0.99})" "\n";
  for (const char* seed : {"1", "2"})  // never reached, whatever three real steps learnt; a null is skipped
    std::ofstream(dir / (std::string("study/p2-t12-d16-vanilla-none-seed") + seed + "/metrics.jsonl"))
        << R"({"step":3,"valid_accuracy":0.5})" "\n" R"({"step":2,"valid_accuracy":null})" "\n";
  ASSERT_EQ(run_tool(study, dir.path()).exit_code, 0);
  const std::string solved = read_file(dir / "study/recall_accuracy.md");
  EXPECT_NE(solved.find("| 0.955 ± 0.021, 1 solved |"), std::string::npos) << solved;
  EXPECT_NE(solved.find("step at which valid accuracy first reached 0.95 (evaluations every 100 steps and at the end)"),
            std::string::npos) << solved;
  EXPECT_NE(solved.find("| 2 | 12 | 16 | 0 of 2 | 1.5 (1-2), 2 of 2 |"), std::string::npos) << solved;
  const std::string solved_csv = read_file(dir / "study/recall_accuracy.csv");
  EXPECT_NE(solved_csv.find("2,12,16,vanilla,affine,1,0.97,2\n"), std::string::npos) << solved_csv;
  EXPECT_NE(solved_csv.find("2,12,16,vanilla,affine,2,0.94,1\n"), std::string::npos) << solved_csv;
  EXPECT_TRUE(std::regex_search(solved_csv, std::regex(R"(\n2,12,16,vanilla,none,1,[0-9.e-]+,\n)"))) << solved_csv;

  // The same folder with other settings is refused, not mixed into the table; so is a repeated seed.
  expect_one_error_line(run_tool(study + " --set train.steps=4", dir.path()), "finished with another config");
  expect_one_error_line(run_tool(study + " --seeds 1,1", dir.path()), "--seeds: a value appears twice");
}

// A run that diverges has no accuracy: it is left out of the tables (not
// counted as 0), named in one error line, and the study exits 3 as a
// diverged `cqk train` does.
TEST(CliTool, RecallStudyLeavesDivergedRunsOutOfTheTables) {
  cqk::testing::TempDir dir("cqk-recall-diverged");
  const auto study = run_tool(tiny_recall_study("--attention vanilla --coupling none --seeds 1") +
                                  " --set train.lr=1e30 --set train.grad_clip=0 --out " + dir / "study",
                              dir.path());
  EXPECT_EQ(study.exit_code, 3) << study.out << study.err;
  EXPECT_NE(study.err.find("1 run(s) diverged and are not in the tables: p2-t12-d16-vanilla-none seed 1"),
            std::string::npos)
      << study.err;
  EXPECT_NE(read_file(dir / "study/recall_accuracy.md").find("| 2 | 12 | 16 | diverged |"), std::string::npos);
  EXPECT_EQ(read_file(dir / "study/recall_accuracy.csv"),
            "pairs,seq_len,width,attention,coupling,seed,test_accuracy,solved_at_step\n");
}

// MTA grid points get MTA in every layer (the default, every 4th, leaves the
// study's 2-layer model none); --set can still choose.
TEST(CliTool, RecallStudyGivesMtaEveryLayerUnlessSet) {
  cqk::testing::TempDir dir("cqk-recall-mta");
  const std::string study = tiny_recall_study("--attention mta --coupling none --seeds 1");
  for (const auto& [extra, every] : {std::pair{"", "every: 1"}, std::pair{" --set model.attention.mta.every=2", "every: 2"}}) {
    const auto out = dir / (std::string("study") + (*extra ? "-set" : ""));
    const auto r = run_tool(study + extra + " --out " + out, dir.path());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string config = read_file(out + "/p2-t12-d16-mta-none-seed1/config.yaml");
    EXPECT_NE(config.find(std::string("    mta:\n      ") + every + "\n"), std::string::npos) << config;
  }
}

TEST(CliTool, InspectPrintsTheModel) {
  cqk::testing::TempDir dir("cqk-cli");
  const auto tool = [&](const std::string& args) { return run_tool(args, dir.path()); };
  const auto by_default = tool("inspect");
  ASSERT_EQ(by_default.exit_code, 0) << by_default.err;
  for (const char* line : {"attention vanilla", "coupling affine", "parameters: ", "coupling share: ",
                           "flops per token: "})
    EXPECT_NE(by_default.out.find(line), std::string::npos) << line << " missing in:\n" << by_default.out;
  EXPECT_TRUE(std::regex_search(by_default.out, std::regex("\nparams: [0-9.]+M \\([0-9]+\\)\n")))
      << by_default.out;

  const auto tiny = tool("inspect " + std::string(CQK_SOURCE_DIR) + "/configs/tiny/recall-diff-affine.yaml" +
                         " --set model.layers=1");
  ASSERT_EQ(tiny.exit_code, 0) << tiny.err;
  EXPECT_NE(tiny.out.find("attention diff"), std::string::npos) << tiny.out;
  EXPECT_NE(tiny.out.find("layers 1 "), std::string::npos) << tiny.out;
  EXPECT_NE(tiny.out.find("\nparams: "), std::string::npos) << tiny.out;
  const auto small_norm = tool("inspect " + std::string(CQK_SOURCE_DIR) + "/configs/tiny/recall-diff-affine.yaml" +
                               " --set model.attention.head_norm_init=0.05");
  EXPECT_NE(small_norm.out.find("attention diff (head norm init 0.05) |"), std::string::npos) << small_norm.out;
  const auto mta = tool("inspect --set model.attention.kind=mta --set model.attention.mta.every=2 "
                        "--set model.attention.head_norm_init=0.5");
  EXPECT_NE(mta.out.find("attention mta (every 2, kernels 6x11, head group 2, head norm init 0.5) |"),
            std::string::npos) << mta.out;

  // --yaml: the resolved config, model.vocab_size taken from data.recall.
  const auto yaml = tool("inspect --yaml --set model.layers=3 --set data.recall.vocab_size=64");
  ASSERT_EQ(yaml.exit_code, 0) << yaml.err;
  EXPECT_NE(yaml.out.find("  layers: 3\n"), std::string::npos) << yaml.out;
  EXPECT_NE(yaml.out.find("  vocab_size: 64\n"), std::string::npos) << yaml.out;
  EXPECT_EQ(yaml.out.find("vocab_size: 0"), std::string::npos) << yaml.out;
}

// The kernel-against-ATen timing of the coupling: both paths timed, and the
// kernel reported as taken exactly where the dispatch would take it.
TEST(CliTool, BenchCouplingTimesTheKernelAndTheAtenPath) {
  cqk::testing::TempDir dir("cqk-cli");
  const auto r = run_tool("bench coupling --shape 2,2,16,64 --repeats 2 --rounds 1 --json", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto result = nlohmann::json::parse(r.out);
  EXPECT_EQ(result["shape"], nlohmann::json({2, 2, 16, 64}));
  EXPECT_EQ(result["threads"], 1);  // CQK_NUM_THREADS of the test environment
  for (const char* path : {"kernel", "aten"}) {
    EXPECT_GT(result[path]["forward_ms"]["min"].get<double>(), 0.0) << path;
    EXPECT_GE(result[path]["forward_backward_ms"]["median"].get<double>(),
              result[path]["forward_backward_ms"]["min"].get<double>())
        << path;
  }
  EXPECT_TRUE(result["aten"]["taken"].get<bool>());
  // The CPU kernel covers this shape on any x86-64 with AVX2; the ATen path is the fallback elsewhere.
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  EXPECT_EQ(result["kernel"]["taken"].get<bool>(), avx2);

  const auto text = run_tool("bench coupling --shape 1,2,8,64 --hidden 16 --repeats 1 --rounds 1", dir.path());
  ASSERT_EQ(text.exit_code, 0) << text.err;
  for (const char* line : {"hidden 16", "\nkernel      ", "aten        forward median", "aten/kernel"})
    EXPECT_NE(text.out.find(line), std::string::npos) << line << " missing in:\n" << text.out;
}

TEST(CliTool, BadInputGivesOneErrorLine) {
  cqk::testing::TempDir dir("cqk-cli");
  const auto tool = [&](const std::string& args) { return run_tool(args, dir.path()); };
  const auto bad_set = tool("inspect --set model.widht=64");
  expect_one_error_line(bad_set, "model.widht");
  EXPECT_NE(bad_set.err.find("did you mean"), std::string::npos) << bad_set.err;

  const std::string file = dir / "bad.yaml";
  std::ofstream(file) << "model:\n  layers: 1\n  widht: 64\n";
  const auto bad_file = tool("inspect " + file);
  expect_one_error_line(bad_file, "model.widht");
  EXPECT_NE(bad_file.err.find("did you mean"), std::string::npos) << bad_file.err;

  expect_one_error_line(tool("train --set train.lr=abc --set run.dir=" + dir / "never"), "train.lr");
  expect_one_error_line(tool("train --resume " + dir.path()), "not a run directory");
}

// --- sample_next ------------------------------------------------------------

at::Tensor random_logits(int64_t rows, int64_t vocab, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn({rows, vocab}, generator, at::kFloat);
}

TEST(SampleNext, TemperatureZeroIsArgmax) {
  const auto logits = random_logits(16, 50, 1);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(0);
  const auto ids = cqk::sample_next(logits, {0.0, 0}, generator);
  EXPECT_EQ(ids.sizes(), (at::IntArrayRef{16}));
  EXPECT_EQ(ids.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(ids, logits.argmax(-1)));
  // One row of logits gives a 0-d id.
  EXPECT_EQ(cqk::sample_next(logits[3], {0.0, 0}, generator).item<int64_t>(), logits[3].argmax().item<int64_t>());
}

TEST(SampleNext, TopKOneIsArgmax) {
  const auto logits = random_logits(16, 50, 2);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(0);
  EXPECT_TRUE(at::equal(cqk::sample_next(logits, {1.0, 1}, generator), logits.argmax(-1)));
  EXPECT_TRUE(at::equal(cqk::sample_next(logits, {5.0, 1}, generator), logits.argmax(-1)));
}

TEST(SampleNext, SamplesOnlyFromTheTopK) {
  const int64_t k = 5;
  const auto row = random_logits(1, 40, 3);
  const auto logits = row.expand({4000, 40}).contiguous();
  auto generator = at::make_generator<at::CPUGeneratorImpl>(11);
  const auto ids = cqk::sample_next(logits, {2.0, k}, generator);
  const auto top = std::get<1>(row[0].topk(k));
  const auto in_top = (ids.unsqueeze(1) == top.unsqueeze(0)).any(1);
  EXPECT_TRUE(in_top.all().item<bool>());
  // At a high temperature every one of the k tokens turns up.
  EXPECT_EQ(std::get<0>(at::_unique(ids)).numel(), k);
}

TEST(SampleNext, FollowsTheSoftmaxAtTheTemperature) {
  // Two tokens with logits 0 and log(3): probabilities 1/4 and 3/4 at T=1, 1/(1+sqrt 3) at T=2.
  const auto logits = at::tensor({0.0f, std::log(3.0f)}).expand({20000, 2}).contiguous();
  auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
  const double p1 = cqk::sample_next(logits, {1.0, 0}, generator).to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(p1, 0.75, 0.02);
  const double p2 = cqk::sample_next(logits, {2.0, 0}, generator).to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(p2, std::sqrt(3.0) / (1.0 + std::sqrt(3.0)), 0.02);
}

TEST(SampleNext, SameSeedSameSamples) {
  const auto logits = random_logits(256, 30, 4);
  const cqk::SamplingOptions options{0.8, 10};
  auto a = at::make_generator<at::CPUGeneratorImpl>(42), b = at::make_generator<at::CPUGeneratorImpl>(42),
       c = at::make_generator<at::CPUGeneratorImpl>(43);
  const auto first = cqk::sample_next(logits, options, a);
  EXPECT_TRUE(at::equal(first, cqk::sample_next(logits, options, b)));
  EXPECT_FALSE(at::equal(first, cqk::sample_next(logits, options, c)));
}

TEST(SampleNext, RejectsBadOptions) {
  const auto logits = random_logits(2, 8, 5);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(0);
  EXPECT_THROW(cqk::sample_next(logits, {-1.0, 0}, generator), std::invalid_argument);
  EXPECT_THROW(cqk::sample_next(logits, {1.0, -2}, generator), std::invalid_argument);
  EXPECT_THROW(cqk::sample_next(at::empty({2, 0}), {1.0, 0}, generator), std::invalid_argument);
}

}  // namespace
