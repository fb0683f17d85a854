// `cqk recall`: the associative-recall study. Trains one small model per grid
// point (pairs x sequence length x width x attention kind x coupling kind) on
// the generated multi-query associative-recall task and tabulates test accuracy.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "cqk/checkpoint.h"
#include "cqk/config_loader.h"
#include "cqk/log.h"
#include "cqk/trainer.h"

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

std::string format_accuracy(double accuracy) {
  char text[16];
  std::snprintf(text, sizeof text, "%.3f", accuracy);
  return text;
}

}  // namespace

void add_recall_command(CLI::App& app) {
  struct Arguments {
    std::vector<int64_t> pairs{4, 8}, seq_lens{32}, widths{64};
    std::vector<std::string> attention{"vanilla", "diff", "qknorm", "mta"}, coupling{"none", "affine"};
    std::vector<std::string> overrides;
    std::string out = "runs/recall";
  };
  auto args = std::make_shared<Arguments>();
  auto* recall = app.add_subcommand("recall", "Associative-recall study: accuracy over a grid of settings");
  recall->add_option("--pairs", args->pairs, "Key-value pairs per sequence")->delimiter(',')->capture_default_str();
  recall->add_option("--seq-len", args->seq_lens, "Sequence lengths")->delimiter(',')->capture_default_str();
  recall->add_option("--width", args->widths, "Model widths")->delimiter(',')->capture_default_str();
  recall->add_option("--attention", args->attention, "Attention kinds")->delimiter(',')->capture_default_str();
  recall->add_option("--coupling", args->coupling, "Coupling kinds")->delimiter(',')->capture_default_str();
  recall->add_option("--set", args->overrides, "Config override applied to every run (e.g. train.steps=400)")
      ->type_name("KEY=VALUE");
  recall->add_option("--out", args->out, "Folder of the study: one run folder per grid point and the tables")
      ->capture_default_str();

  recall->callback([args] {
    std::vector<GridPoint> grid;
    for (auto pairs : args->pairs)
      for (auto seq_len : args->seq_lens)
        for (auto width : args->widths)
          for (const auto& attention : args->attention)
            for (const auto& coupling : args->coupling) grid.push_back({pairs, seq_len, width, attention, coupling});

    // Validate every grid point before spending minutes on the first runs.
    std::vector<Config> configs;
    for (const auto& point : grid) {
      auto overrides = args->overrides;
      overrides.insert(overrides.end(),
                       {"data.kind=recall", "data.recall.pairs=" + std::to_string(point.pairs),
                        "data.seq_len=" + std::to_string(point.seq_len), "model.width=" + std::to_string(point.width),
                        "model.attention.kind=" + point.attention, "model.attention.coupling.kind=" + point.coupling,
                        "run.name=recall-" + point.name()});
      configs.push_back(default_config(overrides));
    }

    std::filesystem::create_directories(args->out);
    std::map<std::string, double> accuracy;  // grid point name -> test accuracy
    for (size_t i = 0; i < grid.size(); ++i) {
      const auto run_dir = (std::filesystem::path(args->out) / grid[i].name()).string();
      log::info("recall run " + std::to_string(i + 1) + "/" + std::to_string(grid.size()) + ": " + grid[i].name());
      TrainOptions options;
      options.run_dir = run_dir;
      options.resume = !list_checkpoints(run_dir).empty();  // an interrupted study picks up where it stopped
      const auto summary = train(configs[i], options);
      if (summary.outcome == TrainOutcome::Interrupted) {
        exit_status() = exit_code(summary.outcome);
        return;
      }
      accuracy[grid[i].name()] = summary.test.accuracy;
    }

    // One row per (pairs, seq_len, width); one column per attention x coupling.
    std::ostringstream markdown, csv;
    markdown << "| pairs | seq_len | width |";
    for (const auto& a : args->attention)
      for (const auto& c : args->coupling) markdown << " " << a << "+" << c << " |";
    markdown << "\n|---|---|---|";
    for (size_t i = 0; i < args->attention.size() * args->coupling.size(); ++i) markdown << "---|";
    markdown << "\n";
    csv << "pairs,seq_len,width,attention,coupling,test_accuracy\n";
    for (auto pairs : args->pairs)
      for (auto seq_len : args->seq_lens)
        for (auto width : args->widths) {
          markdown << "| " << pairs << " | " << seq_len << " | " << width << " |";
          for (const auto& a : args->attention)
            for (const auto& c : args->coupling) {
              const GridPoint point{pairs, seq_len, width, a, c};
              const double acc = accuracy.at(point.name());
              markdown << " " << format_accuracy(acc) << " |";
              csv << pairs << "," << seq_len << "," << width << "," << a << "," << c << "," << acc << "\n";
            }
          markdown << "\n";
        }
    write_file_atomically((std::filesystem::path(args->out) / "recall_accuracy.md").string(), markdown.str());
    write_file_atomically((std::filesystem::path(args->out) / "recall_accuracy.csv").string(), csv.str());
    std::printf("test accuracy on multi-query associative recall\n\n%s\n", markdown.str().c_str());
  });
}

}  // namespace cqk::cli
