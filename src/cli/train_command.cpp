#include <CLI/CLI.hpp>

#include "commands.h"

namespace cqk::cli {

void add_train_command(CLI::App& app) {
  auto* train = app.add_subcommand("train", "Train a model from a YAML config");
  train->callback([] {});
}

}  // namespace cqk::cli
