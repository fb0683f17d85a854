#include <ftw.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cqk/sweep_results.h"
#include "test_io.h"

// `cqk stats` end to end on run folders the test writes, plus the run
// discovery and pairing rules behind it. Expected statistics come from scipy
// 1.17.1 in float64 (scipy.stats.ttest_ind(a, b, equal_var=False), alternative
// 'less' for the one-sided p; Hedges' g with the exact J from math.lgamma),
// computed once by hand on the perplexities below.
namespace {

using cqk::testing::CommandResult;
using cqk::testing::read_file;
using cqk::testing::run_command;
using cqk::testing::shell_quote;

namespace fs = std::filesystem;
namespace sweep = cqk::sweep;

class StatsCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() /
            ("cqk_stats_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    remove_root();
    fs::create_directories(root_);
  }
  void TearDown() override { remove_root(); }

  // Not std::filesystem::remove_all: libtorch.so exports its own copy of it,
  // which crashes (a null call in recursive_directory_iterator) on a non-empty folder.
  void remove_root() const {
    // FTW_DEPTH: a folder's entries before the folder; FTW_PHYS: links are not followed.
    ::nftw(root_.c_str(), [](const char* p, const struct stat*, int, FTW*) { return ::remove(p); }, 16,
           FTW_DEPTH | FTW_PHYS);
  }

  // A run folder; without ppl values it is unfinished (metrics.jsonl only).
  // With `text`, results.json also has bits per byte (ppl / 10) and the seen
  // loss (ppl / 100) in its "valid" and "test" objects, as a run on text has.
  fs::path write_run(const fs::path& dir, const std::string& name, int seed, double valid_ppl = 0,
                     double test_ppl = 0, bool text = false) {
    fs::create_directories(dir);
    std::ofstream(dir / "metrics.jsonl") << R"({"step": 0, "tokens": 0, "loss": 10.0})" << "\n";
    if (valid_ppl > 0) {
      nlohmann::json results = {{"name", name},           {"seed", seed},
                                {"steps", 100},           {"valid_ppl", valid_ppl},
                                {"test_ppl", test_ppl},   {"params", 1000},
                                {"config_hash", "abc"}};
      if (text) {
        results["valid"] = {{"ppl", valid_ppl}, {"bpb", valid_ppl / 10}, {"seen", {{"loss", valid_ppl / 100}, {"tokens", 9}}}};
        results["test"] = {{"ppl", test_ppl}, {"bpb", test_ppl / 10}, {"seen", {{"loss", test_ppl / 100}, {"tokens", 9}}}};
      }
      std::ofstream(dir / "results.json") << results.dump();
    }
    return dir;
  }

  // Three seeds of diff-150m and diff-affine-150m (with `text`, their bpb and
  // seen loss too), two of vanilla-150m (ppl only), one unfinished run.
  void write_sweep(bool text = false) {
    const std::vector<double> diff_valid{21.0, 21.2, 21.4}, diff_test{22.0, 22.4, 22.6};
    const std::vector<double> affine_valid{20.5, 20.6, 20.9}, affine_test{21.5, 21.7, 22.0};
    for (int seed = 0; seed < 3; ++seed) {
      const std::string s = std::to_string(seed);
      write_run(root_ / "sweep" / ("diff-150m-s" + s), "diff-150m", seed, diff_valid[seed], diff_test[seed], text);
      // Two levels down: sweep/<variant>/<seed>.
      write_run(root_ / "sweep" / "diff-affine-150m" / ("s" + s), "diff-affine-150m", seed, affine_valid[seed],
                affine_test[seed], text);
    }
    write_run(root_ / "sweep" / "vanilla-150m-s0", "vanilla-150m", 0, 23.0, 24.0);
    write_run(root_ / "sweep" / "vanilla-150m-s1", "vanilla-150m", 1, 23.5, 24.4);
    write_run(root_ / "sweep" / "vanilla-150m-s2", "vanilla-150m", 2);
  }

  CommandResult run_tool(const std::string& args) const {
    return run_command(std::string(CQK_TOOL) + " stats " + args);
  }

  std::string path(const fs::path& p) const { return shell_quote(p.string()); }

  fs::path root_;
};

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> fields;
  std::stringstream in(line);
  for (std::string field; std::getline(in, field, ',');) fields.push_back(field);
  if (!line.empty() && line.back() == ',') fields.emplace_back();
  return fields;
}

// The CSV row whose first fields are `key` (e.g. "comparison,a,b"), by column name.
std::map<std::string, std::string> csv_row(const std::string& csv, const std::string& key) {
  std::stringstream in(csv);
  std::string header, line;
  std::getline(in, header);
  const auto names = split(header);
  while (std::getline(in, line)) {
    if (line.rfind(key + ",", 0) != 0) continue;
    const auto fields = split(line);
    EXPECT_EQ(fields.size(), names.size()) << line;
    std::map<std::string, std::string> row;
    for (std::size_t i = 0; i < names.size() && i < fields.size(); ++i) row[names[i]] = fields[i];
    return row;
  }
  ADD_FAILURE() << "no CSV row " << key << " in\n" << csv;
  return {};
}

double number(const std::map<std::string, std::string>& row, const std::string& column) {
  return std::stod(row.at(column));
}

TEST_F(StatsCommand, PrintsVariantsAndPairsCoupledVariantsWithTheirBase) {
  write_sweep();
  const auto csv = root_ / "stats.csv";
  const auto md = root_ / "stats.md";
  const auto r = run_tool(path(root_ / "sweep") + " --csv " + path(csv) + " --markdown " + path(md));
  ASSERT_EQ(r.exit_code, 0) << r.out;

  EXPECT_NE(r.out.find("| diff-150m | 3 | 21.200 ± 0.200 | 22.333 ± 0.306 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| diff-affine-150m | 3 | 20.667 ± 0.208 | 21.733 ± 0.252 |"), std::string::npos);
  EXPECT_NE(r.out.find("| vanilla-150m | 2 | 23.250 ± 0.354 | 24.200 ± 0.283 |"), std::string::npos);
  EXPECT_NE(r.out.find("vanilla-150m-s2"), std::string::npos) << "the unfinished run is listed";
  // Automatic pairing; one comparison, so Bonferroni leaves the one-sided p as it is.
  EXPECT_NE(r.out.find("| diff-affine-150m | diff-150m | 3 vs 3 | -0.5333 | -3.200 | 3.99 | 0.0165 | 0.0330 | "
                          "-2.085 | 0.0165 | * |"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(read_file(md), r.out);

  const auto row = csv_row(read_file(csv), "comparison,diff-affine-150m,diff-150m");
  EXPECT_EQ(row.at("metric"), "valid_ppl");
  EXPECT_NEAR(number(row, "mean_diff"), -0.5333333333333314, 1e-9);
  EXPECT_NEAR(number(row, "t"), -3.200000000000002, 1e-9);
  EXPECT_NEAR(number(row, "df"), 3.9936102236421727, 1e-9);
  EXPECT_NEAR(number(row, "p_one_sided"), 0.016487709422845283, 1e-10);
  EXPECT_NEAR(number(row, "p_two_sided"), 0.032975418845690566, 1e-10);
  EXPECT_NEAR(number(row, "hedges_g"), -2.084704050785793, 1e-9);
  EXPECT_NEAR(number(row, "p_bonferroni"), 0.016487709422845283, 1e-10);
  EXPECT_EQ(row.at("significant"), "true");
  const auto variant = csv_row(read_file(csv), "variant,vanilla-150m,,test_ppl");
  EXPECT_EQ(variant.at("n"), "2");
  EXPECT_NEAR(number(variant, "mean"), 24.2, 1e-9);
  EXPECT_NEAR(number(variant, "sd"), 0.282842712474618, 1e-9);
}

TEST_F(StatsCommand, ExplicitPairsAreBonferroniCorrected) {
  write_sweep();
  const auto csv = root_ / "stats.csv";
  const auto r = run_tool(path(root_ / "sweep") + " --metric test_ppl --compare diff-affine-150m:diff-150m" +
                          " --compare vanilla-150m:diff-150m --csv " + path(csv));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string text = read_file(csv);

  const auto coupled = csv_row(text, "comparison,diff-affine-150m,diff-150m");
  EXPECT_EQ(coupled.at("metric"), "test_ppl");
  EXPECT_NEAR(number(coupled, "t"), -2.62556984696209, 1e-9);
  EXPECT_NEAR(number(coupled, "df"), 3.8585152838427925, 1e-9);
  EXPECT_NEAR(number(coupled, "p_one_sided"), 0.030320383660018484, 1e-10);
  EXPECT_NEAR(number(coupled, "p_two_sided"), 0.06064076732003697, 1e-10);
  EXPECT_NEAR(number(coupled, "hedges_g"), -1.7104800298696563, 1e-9);
  EXPECT_NEAR(number(coupled, "p_bonferroni"), 2 * 0.030320383660018484, 1e-10);
  EXPECT_EQ(coupled.at("significant"), "false");  // 0.061 after correction

  const auto worse = csv_row(text, "comparison,vanilla-150m,diff-150m");
  EXPECT_NEAR(number(worse, "t"), 7.000000000000011, 1e-9);
  EXPECT_NEAR(number(worse, "df"), 2.4265402843601995, 1e-9);
  EXPECT_NEAR(number(worse, "p_one_sided"), 0.9942265243401365, 1e-10);
  EXPECT_NEAR(number(worse, "p_two_sided"), 0.011546951319727107, 1e-10);
  EXPECT_NEAR(number(worse, "hedges_g"), 4.530460462629966, 1e-9);
  EXPECT_EQ(number(worse, "p_bonferroni"), 1.0);
}

// The text metrics are the perplexities scaled (bpb = ppl / 10, seen loss =
// ppl / 100): Welch's t, df, p and Hedges' g do not change with the scale, the
// mean difference scales with it.
TEST_F(StatsCommand, ComparesBitsPerByteAndSeenLossFromTheSplitObjects) {
  write_sweep(true);
  for (const auto& [metric, scale] : {std::pair{"valid_bpb", 10.0}, std::pair{"valid_seen_loss", 100.0}}) {
    SCOPED_TRACE(metric);
    const auto csv = root_ / (std::string(metric) + ".csv");
    const auto r = run_tool(path(root_ / "sweep") + " --metric " + metric + " --csv " + path(csv));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find(std::string("## Comparisons on ") + metric), std::string::npos) << r.out;
    const auto row = csv_row(read_file(csv), "comparison,diff-affine-150m,diff-150m");
    EXPECT_EQ(row.at("metric"), metric);
    EXPECT_NEAR(number(row, "mean_diff"), -0.5333333333333314 / scale, 1e-9);
    EXPECT_NEAR(number(row, "t"), -3.200000000000002, 1e-9);
    EXPECT_NEAR(number(row, "df"), 3.9936102236421727, 1e-9);
    EXPECT_NEAR(number(row, "p_one_sided"), 0.016487709422845283, 1e-10);
    EXPECT_NEAR(number(row, "hedges_g"), -2.084704050785793, 1e-9);
  }
  // Every metric some run has gets its variant rows; vanilla-150m has no bpb.
  const std::string csv = read_file(root_ / "valid_bpb.csv");
  EXPECT_NEAR(number(csv_row(csv, "variant,diff-150m,,test_bpb"), "mean"), 2.2333333333333334, 1e-9);
  EXPECT_EQ(csv_row(csv, "variant,diff-affine-150m,,test_seen_loss").at("n"), "3");
  EXPECT_EQ(csv.find("variant,vanilla-150m,,valid_bpb"), std::string::npos) << csv;
  EXPECT_EQ(csv.find("word_ppl"), std::string::npos) << "no run has it: " << csv;
  const auto table = run_tool(path(root_ / "sweep")).out;
  EXPECT_NE(table.find("| variant | n | valid_ppl mean ± sd | test_ppl mean ± sd | valid_bpb mean ± sd | test_bpb mean "
                       "± sd | valid_seen_loss mean ± sd | test_seen_loss mean ± sd |"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("| vanilla-150m | 2 | 23.250 ± 0.354 | 24.200 ± 0.283 | - | - | - | - |"), std::string::npos)
      << table;

  // A comparison on a metric one side lacks names a run without it.
  const auto missing = run_tool(path(root_ / "sweep") + " --metric valid_bpb --compare vanilla-150m:diff-150m");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.out.find("results.json has no valid_bpb"), std::string::npos) << missing.out;
  EXPECT_EQ(std::count(missing.out.begin(), missing.out.end(), '\n'), 1) << missing.out;
}

// Evaluations saved by `cqk eval --save NAME` (RUN/evals/NAME.json) are
// metrics NAME_MEASURE of the runs whose final step they evaluated; here an
// out-of-domain bpb of valid_ppl / 5, so the tests' statistics are those of the
// perplexities (as above) with the difference scaled.
TEST_F(StatsCommand, ComparesEvaluationsSavedForTheFinalStep) {
  write_sweep(true);
  for (const std::string s : {"0", "1", "2"}) {  // vanilla-150m has no saved evaluation
    for (const auto& run : {root_ / "sweep" / ("diff-150m-s" + s), root_ / "sweep" / "diff-affine-150m" / ("s" + s)}) {
      const auto results = nlohmann::json::parse(read_file(run / "results.json"));
      const double ppl = results["valid_ppl"].get<double>();
      fs::create_directories(run / "evals");
      std::ofstream(run / "evals" / "wt2.json")
          << nlohmann::json{{"step", 100}, {"ppl", 2 * ppl}, {"bpb", ppl / 5}, {"seen", {{"loss", ppl / 50}}}}.dump();
    }
  }
  const auto csv = root_ / "wt2.csv";
  const auto r = run_tool(path(root_ / "sweep") + " --metric wt2_bpb --csv " + path(csv));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto row = csv_row(read_file(csv), "comparison,diff-affine-150m,diff-150m");
  EXPECT_EQ(row.at("metric"), "wt2_bpb");
  EXPECT_NEAR(number(row, "mean_diff"), -0.5333333333333314 / 5, 1e-9);
  EXPECT_NEAR(number(row, "t"), -3.200000000000002, 1e-9);
  EXPECT_NEAR(number(row, "df"), 3.9936102236421727, 1e-9);
  EXPECT_NEAR(number(row, "p_one_sided"), 0.016487709422845283, 1e-10);
  EXPECT_NEAR(number(csv_row(read_file(csv), "variant,diff-150m,,wt2_ppl"), "mean"), 42.4, 1e-9);
  // Measure by measure, the run's own evaluations first.
  EXPECT_NE(r.out.find("| variant | n | valid_ppl mean ± sd | test_ppl mean ± sd | wt2_ppl mean ± sd | valid_bpb mean "
                       "± sd | test_bpb mean ± sd | wt2_bpb mean ± sd | valid_seen_loss"),
            std::string::npos)
      << r.out;

  // An evaluation of an earlier checkpoint is left out, with a note; the comparison then names the run.
  const auto stale = root_ / "sweep" / "diff-150m-s1" / "evals" / "wt2.json";
  std::ofstream(stale) << R"({"step": 50, "bpb": 1.0})";
  const auto left_out = run_tool(path(root_ / "sweep"));
  ASSERT_EQ(left_out.exit_code, 0) << left_out.out;
  EXPECT_NE(left_out.out.find("Note: not used: " + stale.string() + ": of step 50, not the run's final step 100"),
            std::string::npos)
      << left_out.out;
  const auto missing = run_tool(path(root_ / "sweep") + " --metric wt2_bpb");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.out.find((root_ / "sweep" / "diff-150m-s1").string() + " has no wt2_bpb (" + stale.string() +
                             " is not of its final step"),
            std::string::npos)
      << missing.out;
  EXPECT_NE(missing.out.find("--save wt2"), std::string::npos) << missing.out;
  EXPECT_EQ(std::count(missing.out.begin(), missing.out.end(), '\n'), 1) << missing.out;

  // Present for the final step but without the measure.
  std::ofstream(stale) << R"({"step": 100, "bpb": 1.0})";
  const auto lacking = run_tool(path(root_ / "sweep") + " --metric wt2_seen_loss");
  EXPECT_EQ(lacking.exit_code, 2);
  EXPECT_NE(lacking.out.find(stale.string() + " lacks it"), std::string::npos) << lacking.out;
  // A file that is not named as a saved evaluation is left out with a note; the rest still counts.
  std::ofstream(root_ / "sweep" / "diff-150m-s0" / "evals" / "WT2.bak.json") << "not json";
  const auto stray = run_tool(path(root_ / "sweep") + " --metric wt2_bpb --compare diff-affine-150m:diff-150m");
  ASSERT_EQ(stray.exit_code, 0) << stray.out;
  EXPECT_NE(stray.out.find("WT2.bak.json: not a saved evaluation"), std::string::npos) << stray.out;
  fs::remove(root_ / "sweep" / "diff-150m-s0" / "evals" / "WT2.bak.json");

  std::ofstream(stale) << R"({"step": 100, "bpb": "1.0"})";
  const auto malformed = run_tool(path(root_ / "sweep"));
  EXPECT_EQ(malformed.exit_code, 2);
  EXPECT_NE(malformed.out.find(stale.string() + ": \"bpb\" must be a number, not string"), std::string::npos)
      << malformed.out;

  const auto bad_metric = run_tool(path(root_ / "sweep") + " --metric wt2_loss");
  EXPECT_EQ(bad_metric.exit_code, 2);
  EXPECT_NE(bad_metric.out.find("unknown metric 'wt2_loss'"), std::string::npos) << bad_metric.out;
  EXPECT_EQ(std::count(bad_metric.out.begin(), bad_metric.out.end(), '\n'), 1) << bad_metric.out;
}

// error is 1 - accuracy, so lower is better as for every measure: with
// accuracy = 1 - test_ppl / 100 its Welch test is test_ppl's, scaled. A
// forgotten complement would flip the sign of Δ and t.
TEST_F(StatsCommand, ComparesTheErrorAsOneMinusTheAccuracy) {
  write_sweep();
  for (const auto& run : sweep::find_runs({root_ / "sweep"}).finished) {
    auto results = nlohmann::json::parse(read_file(run.dir / "results.json"));
    results["test"] = {{"accuracy", 1 - results["test_ppl"].get<double>() / 100}};
    std::ofstream(run.dir / "results.json") << results.dump();
  }
  const auto csv = root_ / "error.csv", ppl_csv = root_ / "ppl.csv";
  const auto r = run_tool(path(root_ / "sweep") + " --metric test_error --csv " + path(csv));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ASSERT_EQ(run_tool(path(root_ / "sweep") + " --metric test_ppl --csv " + path(ppl_csv)).exit_code, 0);
  const auto error = csv_row(read_file(csv), "comparison,diff-affine-150m,diff-150m");
  const auto ppl = csv_row(read_file(ppl_csv), "comparison,diff-affine-150m,diff-150m");
  EXPECT_NEAR(number(error, "mean_diff"), (21.5 + 21.7 + 22.0 - 22.0 - 22.4 - 22.6) / 3 / 100, 1e-12);
  for (const char* column : {"t", "df", "p_one_sided", "hedges_g"}) {
    EXPECT_NEAR(number(error, column), number(ppl, column), 1e-9) << column;
  }
  EXPECT_NEAR(number(csv_row(read_file(csv), "variant,vanilla-150m,,test_error"), "mean"), (0.24 + 0.244) / 2, 1e-12);
}

// A saved evaluation's NAME must mean one text in every run: another split or
// another amount of text under the same NAME stops stats when NAME is the one
// compared, naming both files; otherwise NAME is left out with a note.
TEST_F(StatsCommand, ASavedEvaluationThatDiffersBetweenRunsIsNotUsed) {
  write_sweep(true);
  std::vector<fs::path> files;
  for (const auto& run : sweep::find_runs({root_ / "sweep"}).finished) {
    fs::create_directories(run.dir / "evals");
    files.push_back(run.dir / "evals" / "wt2.json");
  }
  const auto save = [](const fs::path& file, const std::string& split, long long bytes) {
    std::ofstream(file) << nlohmann::json{{"step", 100}, {"split", split}, {"data", "data/wt2"},
                                          {"bytes", bytes}, {"tokens", 500}, {"bpb", 1.5}}
                               .dump();
  };
  for (const auto& file : files) save(file, "valid", 1000);
  ASSERT_EQ(run_tool(path(root_ / "sweep")).exit_code, 0);

  save(files.back(), "test", 1000);
  const std::string why = "saved evaluation 'wt2' differs in split between runs: " + files.front().string() +
                          " (valid of data/wt2, 1000 bytes) and " + files.back().string() +
                          " (test of data/wt2, 1000 bytes)";
  const auto split = run_tool(path(root_ / "sweep") + " --metric wt2_bpb");
  EXPECT_EQ(split.exit_code, 2);
  EXPECT_NE(split.out.find(why), std::string::npos) << split.out;
  EXPECT_EQ(std::count(split.out.begin(), split.out.end(), '\n'), 1) << split.out;
  // Another metric: the report comes, without wt2's columns, and says why.
  const auto other = run_tool(path(root_ / "sweep") + " --metric valid_ppl");
  EXPECT_EQ(other.exit_code, 0) << other.out;
  EXPECT_NE(other.out.find("not used: " + why), std::string::npos) << other.out;
  EXPECT_EQ(other.out.find("wt2_bpb"), std::string::npos) << other.out;

  save(files.back(), "valid", 999);
  const auto bytes = run_tool(path(root_ / "sweep") + " --metric wt2_bpb");
  EXPECT_EQ(bytes.exit_code, 2);
  EXPECT_NE(bytes.out.find("differs in bytes"), std::string::npos) << bytes.out;

  // Files that record no split or size (older ones) are not compared on them.
  std::ofstream(files.back()) << R"({"step": 100, "bpb": 1.5})";
  EXPECT_EQ(run_tool(path(root_ / "sweep") + " --metric wt2_bpb").exit_code, 0);
  // ... and do not hide two later ones that disagree when such a file comes first.
  std::ofstream(files.front()) << R"({"step": 100, "bpb": 1.5})";
  save(files.back(), "test", 1000);
  const auto behind_old = run_tool(path(root_ / "sweep") + " --metric wt2_bpb");
  EXPECT_EQ(behind_old.exit_code, 2);
  EXPECT_NE(behind_old.out.find("differs in split"), std::string::npos) << behind_old.out;
}

// Runs that all end alike (a recall task every seed solves: error 0) leave
// nothing to test; the report still comes, with the pair noted, and the
// other comparisons stand.
TEST_F(StatsCommand, APairWithoutSpreadIsNotedAndTheReportStillComes) {
  write_sweep();
  for (int seed = 0; seed < 3; ++seed) {
    write_run(root_ / "sweep" / ("flat-s" + std::to_string(seed)), "flat", seed, 20.0, 20.0);
    write_run(root_ / "sweep" / ("flat-affine-s" + std::to_string(seed)), "flat-affine", seed, 19.0, 19.0);
  }
  const auto r = run_tool(path(root_ / "sweep"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("Note: not compared: flat-affine vs flat: every run of each has the same valid_ppl (19 and 20), "
                       "no spread to test a difference against"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("| flat-affine | 3 | 19.000 ± 0.000 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| diff-affine-150m | diff-150m | 3 vs 3 |"), std::string::npos) << r.out;
}

// Runs of other lengths or sizes under one name (a rerun sweep skips the runs it
// finished before), and a base of another length, are noted, not silently pooled.
TEST_F(StatsCommand, UnlikeRunsOfAVariantOrItsBaseAreNoted) {
  write_sweep();
  const auto clean = run_tool(path(root_ / "sweep"));
  ASSERT_EQ(clean.exit_code, 0) << clean.out;
  EXPECT_EQ(clean.out.find("unlike"), std::string::npos) << clean.out;

  const auto rewrite = [](const fs::path& results, const std::string& key, long long value) {
    auto json = nlohmann::json::parse(read_file(results.string()));
    json[key] = value;
    std::ofstream(results) << json.dump();
  };
  rewrite(root_ / "sweep/diff-150m-s2/results.json", "steps", 40);
  const auto mixed = run_tool(path(root_ / "sweep"));
  ASSERT_EQ(mixed.exit_code, 0) << mixed.out;
  EXPECT_NE(mixed.out.find("Note: diff-150m pools unlike runs: 40 steps (" + (root_ / "sweep/diff-150m-s2").string() +
                           ") and 100 ("),
            std::string::npos)
      << mixed.out;

  rewrite(root_ / "sweep/diff-150m-s2/results.json", "steps", 100);
  rewrite(root_ / "sweep/diff-150m-s1/results.json", "params", 999);
  for (int seed = 0; seed < 3; ++seed)
    rewrite(root_ / "sweep/diff-affine-150m" / ("s" + std::to_string(seed)) / "results.json", "steps", 200);
  const auto other = run_tool(path(root_ / "sweep"));
  ASSERT_EQ(other.exit_code, 0) << other.out;
  EXPECT_NE(other.out.find("Note: diff-150m pools unlike runs: 999 parameters ("), std::string::npos) << other.out;
  EXPECT_NE(other.out.find("Note: diff-affine-150m vs diff-150m: the variant trained 200 steps, the base 100"),
            std::string::npos)
      << other.out;
}

TEST_F(StatsCommand, ErrorsAreOneLineWithNonZeroExit) {
  write_sweep();
  const auto unknown = run_tool(path(root_ / "sweep") + " --compare diff-affine-150m:nope");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.out.find("--compare 'diff-affine-150m:nope': unknown variant 'nope'"), std::string::npos)
      << unknown.out;
  EXPECT_EQ(std::count(unknown.out.begin(), unknown.out.end(), '\n'), 1) << unknown.out;

  const auto bad_pair = run_tool(path(root_ / "sweep") + " --compare vanilla-150m:diff-150m --compare x");
  EXPECT_EQ(bad_pair.exit_code, 2);
  EXPECT_NE(bad_pair.out.find("expected VARIANT:BASE"), std::string::npos) << bad_pair.out;

  const auto bad = write_run(root_ / "sweep" / "broken", "broken", 0);
  std::ofstream(bad / "results.json") << R"({"name": "broken", "seed": 0, "valid_ppl": )";
  const auto malformed = run_tool(path(root_ / "sweep"));
  EXPECT_EQ(malformed.exit_code, 2);
  EXPECT_NE(malformed.out.find((bad / "results.json").string() + ": [json.exception.parse_error"),
            std::string::npos)
      << malformed.out;

  write_run(root_ / "empty" / "r0", "unfinished", 0);
  const auto none = run_tool(path(root_ / "empty"));
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.out.find(" (each folder and two levels below it; unfinished runs: 1)"), std::string::npos) << none.out;
}

TEST_F(StatsCommand, ReadRunResultNamesTheFieldAndFile) {
  const auto dir = write_run(root_ / "run", "x", 1, 20.0, 21.0);
  // results.json without "steps" (older runs): no saved evaluation can be shown to be of the final step.
  fs::create_directories(dir / "evals");
  std::ofstream(dir / "evals" / "ood.json") << R"({"step": 100, "bpb": 1.5})";
  std::ofstream(dir / "results.json") << R"({"name": "x", "seed": 1, "valid_ppl": 20, "test_ppl": 21})";
  const auto old = sweep::read_run_result(dir);
  EXPECT_EQ(sweep::metric_value(old, "ood_bpb"), std::nullopt);
  ASSERT_EQ(old.ignored_evaluations.size(), 1u);
  EXPECT_EQ(old.ignored_evaluations[0].file, dir / "evals" / "ood.json");
  EXPECT_NE(old.ignored_evaluations[0].why.find("records no final step"), std::string::npos);
  write_run(dir, "x", 1, 20.0, 21.0);
  EXPECT_EQ(sweep::metric_value(sweep::read_run_result(dir), "ood_bpb"), 1.5);
  const auto run = sweep::read_run_result(dir);
  EXPECT_EQ(run.name, "x");
  EXPECT_EQ(run.seed, 1);
  EXPECT_EQ(run.steps, 100);
  EXPECT_EQ(sweep::metric_value(run, "test_ppl"), 21.0);
  EXPECT_EQ(sweep::metric_value(run, "valid_bpb"), std::nullopt);
  EXPECT_EQ(run.config_hash, "abc");

  std::ofstream(dir / "results.json") << R"({"name": "x", "seed": 1, "valid_ppl": "20", "test_ppl": 21})";
  try {
    sweep::read_run_result(dir);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), (dir / "results.json").string() + ": \"valid_ppl\" must be a number, not string");
  }
  std::ofstream(dir / "results.json") << R"({"name": "x", "seed": 1, "valid_ppl": 20, "test_ppl": 21, "test": {"seen": {"loss": null}}})";
  try {
    sweep::read_run_result(dir);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), (dir / "results.json").string() + ": \"test.seen.loss\" must be a number, not null");
  }
}

TEST_F(StatsCommand, FindRunsLooksTwoLevelsDownAndCountsEachRunOnce) {
  write_run(root_ / "a", "top", 0, 20.0, 21.0);                       // the root itself would be a run
  write_run(root_ / "sweep" / "r1", "one", 1, 20.0, 21.0);            // one level down
  write_run(root_ / "sweep" / "group" / "r2", "two", 2, 20.0, 21.0);  // two levels down
  write_run(root_ / "sweep" / "group" / "deeper" / "r3", "three", 3, 20.0, 21.0);  // too deep
  write_run(root_ / "sweep" / "r4", "unfinished", 4);
  const auto runs = sweep::find_runs({root_ / "sweep", root_ / "sweep" / "r1", root_ / "a"});
  ASSERT_EQ(runs.finished.size(), 3u);
  EXPECT_EQ(runs.finished[0].name, "one");
  EXPECT_EQ(runs.finished[1].name, "top");
  EXPECT_EQ(runs.finished[2].name, "two");
  ASSERT_EQ(runs.unfinished.size(), 1u);
  EXPECT_EQ(runs.unfinished[0].dir.filename(), "r4");
  EXPECT_FALSE(runs.unfinished[0].diverged.has_value());
  EXPECT_THROW(sweep::find_runs({root_ / "missing"}), std::runtime_error);
}

// A diverged run is listed with where it diverged, and its variant gets a
// note: its figures are of the runs that survived.
TEST_F(StatsCommand, NamesDivergedRunsAndTheVariantsTheyLeave) {
  write_sweep();
  const auto dir = write_run(root_ / "sweep" / "diff-affine-150m-s4", "diff-affine-150m", 4);
  sweep::write_divergence(dir, {"diff-affine-150m", 4, 37, "nan", "gradient of layers.0.attention.coupling.w1"});
  const auto runs = sweep::find_runs({root_ / "sweep"});
  const auto diverged = std::find_if(runs.unfinished.begin(), runs.unfinished.end(),
                                     [](const sweep::UnfinishedRun& r) { return r.diverged.has_value(); });
  ASSERT_NE(diverged, runs.unfinished.end());
  EXPECT_EQ(diverged->dir, dir);
  EXPECT_EQ(diverged->diverged->step, 37);

  const auto r = run_tool(path(root_ / "sweep"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("- " + dir.string() +
                       ": diverged at step 37 (loss nan; first non-finite: gradient of layers.0.attention.coupling.w1)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("Note: diff-affine-150m: 1 run(s) diverged (seed 4) and are not counted; its figures are of "
                       "the runs that finished"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("| diff-affine-150m | 3 |"), std::string::npos) << "still three finished runs";

  // Diverged before its first metrics line: diverged.json alone makes it a run folder.
  const auto early = root_ / "sweep" / "vanilla-150m-s9";
  fs::create_directories(early);
  sweep::write_divergence(early, {"vanilla-150m", 9, 2, "inf", "the loss only"});
  const auto with_early = run_tool(path(root_ / "sweep"));
  EXPECT_NE(with_early.out.find("- " + early.string() + ": diverged at step 2"), std::string::npos) << with_early.out;
  EXPECT_NE(with_early.out.find("Note: vanilla-150m: 1 run(s) diverged (seed 9)"), std::string::npos)
      << with_early.out;

  std::ofstream(sweep::divergence_path(dir)) << R"({"name": "diff-affine-150m", "seed": 4, "step": "x"})";
  const auto broken = run_tool(path(root_ / "sweep"));
  EXPECT_NE(broken.exit_code, 0);
  EXPECT_NE(broken.out.find(sweep::divergence_path(dir).string() + ": \"step\" must be an integer, not string"),
            std::string::npos)
      << broken.out;
}

TEST(StatsSweep, CouplingBaseRemovesTheCouplingMarker) {
  EXPECT_EQ(sweep::coupling_base("diff-affine-150m"), "diff-150m");
  EXPECT_EQ(sweep::coupling_base("diff-affine"), "diff");
  EXPECT_EQ(sweep::coupling_base("mta+affine"), "mta");
  EXPECT_EQ(sweep::coupling_base("vanilla-coupled-60m"), "vanilla-60m");
  EXPECT_EQ(sweep::coupling_base("diff-affinely"), std::nullopt);  // not a whole marker
  EXPECT_EQ(sweep::coupling_base("vanilla-150m"), std::nullopt);
  EXPECT_EQ(sweep::coupling_base("-affine"), std::nullopt);
}

TEST(StatsSweep, AutomaticPairsNeedTheBaseToExist) {
  const std::vector<std::string> variants{"diff-150m", "diff-affine-150m", "mta-affine-150m", "qknorm+affine",
                                          "qknorm"};
  const std::vector<std::pair<std::string, std::string>> expected{{"diff-affine-150m", "diff-150m"},
                                                                  {"qknorm+affine", "qknorm"}};
  EXPECT_EQ(sweep::automatic_pairs(variants), expected);
}

TEST(StatsSweep, ChecksMetricNames) {
  for (const std::string metric : {"valid_ppl", "test_ppl", "valid_bpb", "test_bpb", "valid_word_ppl",
                                   "test_word_ppl", "valid_seen_loss", "test_seen_loss", "wt2_bpb", "ood-2_seen_loss",
                                   "test_error", "wt2_error"}) {
    EXPECT_NO_THROW(sweep::check_metric_name(metric)) << metric;
  }
  for (const std::string metric : {"loss", "valid_loss", "valid", "wt2", "_bpb", "wt2_", "Wt2_bpb", "-x_bpb",
                                   "wt 2_bpb", "valid_bpb_x"}) {
    EXPECT_THROW(sweep::check_metric_name(metric), std::invalid_argument) << metric;
  }
  EXPECT_NO_THROW(sweep::check_evaluation_name("wikitext-2"));
  for (const std::string name : {"valid", "test", "", "-a", "a_b", "A", "a/b", "..", "a.b"}) {
    EXPECT_THROW(sweep::check_evaluation_name(name), std::invalid_argument) << name;
  }
  EXPECT_EQ(sweep::saved_evaluation_path("runs/r", "wt2"), fs::path("runs/r/evals/wt2.json"));
}

}  // namespace
