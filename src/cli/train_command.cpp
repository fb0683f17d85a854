#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "cqk/config_loader.h"
#include "cqk/trainer.h"

namespace cqk::cli {

void add_train_command(CLI::App& app) {
  struct Arguments {
    std::string config_path;
    std::vector<std::string> overrides;
    TrainOptions options;
  };
  auto args = std::make_shared<Arguments>();
  auto* train = app.add_subcommand("train", "Train a model from a YAML config (default: the embedded tiny config)");
  train->add_option("config", args->config_path, "YAML config file; omitted: the embedded configs/default.yaml");
  train->add_option("--set", args->overrides, "Override a config key, e.g. --set model.attention.coupling.kind=affine")
      ->type_name("KEY=VALUE");
  train->add_option("--run-dir", args->options.run_dir, "Run directory (default: run.dir or runs/<name>-seed<seed>)");
  auto* resume = train->add_option("--resume", args->options.run_dir, "Continue the run in this directory")
                     ->type_name("RUN_DIR");
  train->add_option("--max-steps", args->options.max_steps,
                    "Stop after this many steps in this invocation, with a checkpoint (resume later)")
      ->check(positive_number());
  train->add_option("--profile-steps", args->options.profile_steps,
                    "Record steps A to B (1-based) with the profiler: RUN/profile/steps-A-B.json and a table in the log")
      ->type_name("A:B");
  train->add_option("--memory-snapshot-step", args->options.memory_snapshot_step,
                    "CUDA: write the allocator's snapshot after this step to RUN/profile/ (pytorch.org/memory_viz)")
      ->check(positive_number());
  resume->excludes("config");
  resume->excludes("--run-dir");  // both name the run's folder
  train->callback([args, resume] {
    args->options.resume = resume->count() > 0;
    Config config;
    if (args->options.resume) {
      if (!args->overrides.empty()) throw std::invalid_argument("--set cannot change the config of a resumed run");
      config = load_run_config(args->options.run_dir);
    } else if (args->config_path.empty()) {
      config = default_config(args->overrides);
    } else {
      config = load_config(args->config_path, args->overrides);
    }
    exit_status() = exit_code(cqk::train(config, args->options).outcome);
  });
}

}  // namespace cqk::cli
