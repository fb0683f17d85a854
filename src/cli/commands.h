#pragma once
// Each subcommand of the `cqk` tool registers itself on the app from its own file.
namespace CLI {
class App;
}

namespace cqk::cli {

void add_train_command(CLI::App& app);

}  // namespace cqk::cli
