// `cqk recall`: the associative-recall study. Trains one small model per grid
// point (pairs x sequence length x width x attention kind x coupling kind) and
// seed on the generated multi-query associative-recall task and tabulates test
// accuracy (mean and standard deviation over the seeds) and how soon the runs
// solved it.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "cqk/attention_options.h"
#include "cqk/atomic_file.h"
#include "cqk/checkpoint.h"
#include "cqk/config_loader.h"
#include "cqk/coupling_options.h"
#include "cqk/log.h"
#include "cqk/statistics.h"
#include "cqk/trainer.h"
#include "support/printf_number.h"
#include "train/run_setup.h"

namespace cqk::cli {

namespace {

struct GridPoint {
  int64_t pairs, seq_len, width;
  std::string attention, coupling;
  std::string name() const {
    return "p" + std::to_string(pairs) + "-t" + std::to_string(seq_len) + "-d" + std::to_string(width) + "-" +
           attention + "-" + coupling;
  }
};

// A run solved the task at this accuracy: test accuracy at its end, valid
// accuracy at an evaluation for how soon. Runs learn the binding of keys
// to values in part or in full (from near 1/pairs, any of the sequence's
// values, up to 1), so across seeds the mean hides what the count shows.
constexpr double kSolvedAccuracy = 0.95;

// What a study keeps of one finished run.
struct RunResult {
  double test_accuracy = 0;
  std::optional<int64_t> solved_at_step;  // the first evaluation with valid accuracy >= kSolvedAccuracy
};

// "0.912" for one seed, "0.912 ± 0.031, 2 solved" (sample sd; runs at or above
// kSolvedAccuracy) for several; the count of seeds when some of the `seeds`
// runs diverged, "diverged" when all did.
std::string format_accuracy(const std::vector<RunResult>& results, size_t seeds) {
  if (results.empty()) return "diverged";
  std::vector<double> accuracies;
  for (const auto& r : results) accuracies.push_back(r.test_accuracy);
  std::string text;
  if (accuracies.size() == 1) {
    text = printf_number("%.3f", accuracies[0]);
  } else {
    const auto solved =
        std::count_if(accuracies.begin(), accuracies.end(), [](double a) { return a >= kSolvedAccuracy; });
    text = printf_number("%.3f", stats::mean(accuracies)) + " ± " +
           printf_number("%.3f", stats::sample_sd(accuracies)) + ", " + std::to_string(solved) + " solved";
  }
  if (accuracies.size() == seeds) return text;
  return text + " (" + std::to_string(accuracies.size()) + " of " + std::to_string(seeds) + " seeds)";
}

// "260 (200-300), 9 of 10": the mean and range of the step at which valid
// accuracy first reached kSolvedAccuracy, over the runs that reached it, and
// how many of the finished runs did; "diverged" when none finished.
std::string format_solved_step(const std::vector<RunResult>& results) {
  if (results.empty()) return "diverged";
  std::vector<double> steps;
  for (const auto& r : results)
    if (r.solved_at_step) steps.push_back(static_cast<double>(*r.solved_at_step));
  const std::string count = std::to_string(steps.size()) + " of " + std::to_string(results.size());
  if (steps.empty()) return count;
  const auto [low, high] = std::minmax_element(steps.begin(), steps.end());
  const double mean = stats::mean(steps);
  return printf_number(mean == std::floor(mean) ? "%.0f" : "%.1f", mean) + " (" + printf_number("%.0f", *low) + "-" +
         printf_number("%.0f", *high) + "), " + count;
}

// The first evaluation step at which the run's valid accuracy reached
// kSolvedAccuracy (its metrics.jsonl: an evaluation every train.eval_every
// steps and the final one), nullopt when none did. A torn line, or one whose
// fields are not numbers, is skipped.
std::optional<int64_t> solved_at_step(const std::filesystem::path& run_dir) {
  std::ifstream metrics(run_dir / "metrics.jsonl");
  std::optional<int64_t> first;
  for (std::string line; std::getline(metrics, line);) {
    const auto entry = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!entry.is_object() || !entry.contains("valid_accuracy") || !entry["valid_accuracy"].is_number() ||
        !entry.contains("step") || !entry["step"].is_number_integer())
      continue;
    if (entry["valid_accuracy"].get<double>() < kSolvedAccuracy) continue;
    const auto step = entry["step"].get<int64_t>();
    if (!first || step < *first) first = step;
  }
  return first;
}

// Test accuracy of a run that finished with this config (its results.json), or
// nullopt when it has not finished. A run finished with another config (the
// same --out with other settings) is an error, not a result to reuse.
std::optional<double> finished_accuracy(const std::filesystem::path& run_dir, const Config& config) {
  const auto path = (run_dir / "results.json").string();
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string found_hash;
  double accuracy = 0;
  try {
    const auto results = nlohmann::json::parse(in);
    found_hash = results.value("config_hash", std::string());
    accuracy = results.at("test").at("accuracy").get<double>();
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  const std::string expected = run_config_hash(run_dir.string(), config);
  if (found_hash != expected)
    throw std::runtime_error(run_dir.string() + ": finished with another config (config_hash " + found_hash +
                             ", this study's " + expected + "); use another --out or remove the folder");
  return accuracy;
}

// Each value once: a repeated seed would reuse its first run's result as a second sample.
template <class T>
void require_distinct(const std::string& option, const std::vector<T>& values) {
  for (size_t i = 0; i < values.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (values[i] == values[j])
        throw std::invalid_argument(option + ": a value appears twice (each grid value and seed once)");
}

}  // namespace

void add_recall_command(CLI::App& app) {
  struct Arguments {
    std::vector<int64_t> pairs{4, 8}, seq_lens{32}, widths{64}, seeds{1};
    std::vector<std::string> attention = attention_kind_names(), coupling{"none", "affine"};
    std::vector<std::string> overrides;
    std::string out = "runs/recall";
  };
  auto args = std::make_shared<Arguments>();
  auto* recall = app.add_subcommand("recall", "Associative-recall study: accuracy over a grid of settings");
  recall->add_option("--pairs", args->pairs, "Key-value pairs per sequence")->delimiter(',')->capture_default_str();
  recall->add_option("--seq-len", args->seq_lens, "Sequence lengths")->delimiter(',')->capture_default_str();
  recall->add_option("--width", args->widths, "Model widths")->delimiter(',')->capture_default_str();
  recall->add_option("--attention", args->attention, "Attention kinds")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::IsMember(attention_kind_names()));
  recall->add_option("--coupling", args->coupling, "Coupling kinds")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::IsMember(coupling_kind_names()));
  recall->add_option("--seeds", args->seeds, "Seeds: every grid point is trained once per seed")
      ->delimiter(',')
      ->capture_default_str();
  recall->add_option("--set", args->overrides, "Config override applied to every run (e.g. train.steps=400)")
      ->type_name("KEY=VALUE");
  recall->add_option("--out", args->out, "Folder of the study: one run folder per grid point and the tables")
      ->capture_default_str();

  recall->callback([args] {
    require_distinct("--pairs", args->pairs);
    require_distinct("--seq-len", args->seq_lens);
    require_distinct("--width", args->widths);
    require_distinct("--attention", args->attention);
    require_distinct("--coupling", args->coupling);
    require_distinct("--seeds", args->seeds);
    std::vector<GridPoint> grid;
    for (auto pairs : args->pairs)
      for (auto seq_len : args->seq_lens)
        for (auto width : args->widths)
          for (const auto& attention : args->attention)
            for (const auto& coupling : args->coupling) grid.push_back({pairs, seq_len, width, attention, coupling});

    // Validate every grid point before spending minutes on the first runs.
    struct Run {
      const GridPoint* point;
      int64_t seed;
      Config config;
      std::string dir;
    };
    std::vector<Run> runs;
    // Seeds outer: a study cut short holds whole seeds of every grid point, the pairs `cqk stats` compares.
    for (const auto seed : args->seeds) {
      for (const auto& point : grid) {
        // MTA in every layer: the default (every 4th) leaves a 2-layer model
        // none. Before the user's --set, which may change it.
        std::vector<std::string> overrides;
        if (point.attention == "mta") overrides.push_back("model.attention.mta.every=1");
        overrides.insert(overrides.end(), args->overrides.begin(), args->overrides.end());
        overrides.insert(overrides.end(),
                         {"data.kind=recall", "data.recall.pairs=" + std::to_string(point.pairs),
                          "data.seq_len=" + std::to_string(point.seq_len), "model.width=" + std::to_string(point.width),
                          "model.attention.kind=" + point.attention, "model.attention.coupling.kind=" + point.coupling,
                          "run.name=recall-" + point.name(), "run.seed=" + std::to_string(seed)});
        Config config = default_config(overrides);
        // Resolved as the trainer does, so that config_hash matches the one in results.json.
        take_vocab_size_from_data(config.model, config.data.recall.vocab_size, "data.recall.vocab_size");
        runs.push_back({&point, seed, config,
                        (std::filesystem::path(args->out) / (point.name() + "-seed" + std::to_string(seed))).string()});
      }
    }

    const int64_t eval_every = runs.front().config.train.eval_every;  // runs: one per grid point and seed, at least one
    std::filesystem::create_directories(args->out);
    std::map<std::string, std::vector<RunResult>> results;  // grid point name -> one per finished seed
    std::vector<std::string> diverged;
    std::ostringstream csv;
    csv << "pairs,seq_len,width,attention,coupling,seed,test_accuracy,solved_at_step\n";
    for (size_t i = 0; i < runs.size(); ++i) {
      const Run& run = runs[i];
      const std::string label = "recall run " + std::to_string(i + 1) + "/" + std::to_string(runs.size()) + ": " +
                                run.point->name() + " seed " + std::to_string(run.seed);
      std::optional<double> acc = finished_accuracy(run.dir, run.config);  // a study run again skips what it has
      if (acc) {
        log::info(label + " (finished before)");
      } else {
        log::info(label);
        TrainOptions options;
        options.run_dir = run.dir;
        options.resume = !list_checkpoints(run.dir).empty();  // an interrupted run picks up where it stopped
        const auto summary = train(run.config, options);
        if (summary.outcome == TrainOutcome::Interrupted) {
          exit_status() = exit_code(summary.outcome);
          return;
        }
        if (summary.outcome == TrainOutcome::Diverged) {  // no accuracy to report: out of the table, and counted
          log::warn(label + " diverged: left out of the tables (a rerun with these settings diverges again; other "
                    "settings, through --set, need a new --out)");
          diverged.push_back(run.point->name() + " seed " + std::to_string(run.seed));
          continue;
        }
        acc = summary.test.accuracy;
      }
      const RunResult result{*acc, solved_at_step(run.dir)};
      results[run.point->name()].push_back(result);
      const GridPoint& p = *run.point;
      csv << p.pairs << "," << p.seq_len << "," << p.width << "," << p.attention << "," << p.coupling << ","
          << run.seed << "," << result.test_accuracy << ","
          << (result.solved_at_step ? std::to_string(*result.solved_at_step) : "") << "\n";
    }

    // One row per (pairs, seq_len, width); one column per attention x coupling; `cell` fills it.
    const auto table = [&](const std::function<std::string(const std::vector<RunResult>&)>& cell) {
      std::ostringstream markdown;
      markdown << "| pairs | seq_len | width |";
      for (const auto& a : args->attention)
        for (const auto& c : args->coupling) markdown << " " << a << "+" << c << " |";
      markdown << "\n|---|---|---|";
      for (size_t i = 0; i < args->attention.size() * args->coupling.size(); ++i) markdown << "---|";
      markdown << "\n";
      for (auto pairs : args->pairs)
        for (auto seq_len : args->seq_lens)
          for (auto width : args->widths) {
            markdown << "| " << pairs << " | " << seq_len << " | " << width << " |";
            for (const auto& a : args->attention)
              for (const auto& c : args->coupling)
                markdown << " " << cell(results[GridPoint{pairs, seq_len, width, a, c}.name()]) << " |";
            markdown << "\n";
          }
      return markdown.str();
    };
    const size_t seeds = args->seeds.size();
    const std::string accuracy_title =
        "test accuracy on multi-query associative recall (" + std::to_string(seeds) + " seed" +
        (seeds == 1 ? ")" : "s: mean ± sd, and the seeds that solved it (test accuracy >= " +
                                printf_number("%.2f", kSolvedAccuracy) + "))");
    const std::string solved_title =
        "step at which valid accuracy first reached " + printf_number("%.2f", kSolvedAccuracy) +
        " (evaluations every " + std::to_string(eval_every) +
        " steps and at the end): mean (range) over the runs that reached it, and how many of the finished runs did";
    const std::string markdown = accuracy_title + "\n\n" +
                                 table([&](const auto& r) { return format_accuracy(r, seeds); }) + "\n" +
                                 solved_title + "\n\n" + table(format_solved_step);
    write_file_atomically((std::filesystem::path(args->out) / "recall_accuracy.md").string(), markdown);
    write_file_atomically((std::filesystem::path(args->out) / "recall_accuracy.csv").string(), csv.str());
    std::printf("%s", markdown.c_str());
    if (!diverged.empty()) {
      std::string runs_text;
      for (const auto& run : diverged) runs_text += (runs_text.empty() ? "" : ", ") + run;
      log::error(std::to_string(diverged.size()) + " run(s) diverged and are not in the tables: " + runs_text);
      exit_status() = exit_code(TrainOutcome::Diverged);
    }
  });
}

}  // namespace cqk::cli
