#pragma once
// Each subcommand of the `cqk` tool registers itself on the app from its own file.
namespace CLI {
class App;
class Validator;
}

#include <functional>
#include <string>

namespace cqk::cli {

// The status main returns after a subcommand ran (0 unless the command sets it).
int& exit_status();
// The first line of an error message, without torch's backtrace.
std::string one_line(const std::string& message);
// A CLI11 option check from a check that throws std::invalid_argument naming the problem.
std::function<std::string(const std::string&)> option_check(void (*check)(const std::string&));
// Number checks whose errors state the rule and the value ("--threads: must be
// positive, got 0"); CLI11's own print a range up to DBL_MAX.
CLI::Validator positive_number();
CLI::Validator non_negative_number();

void add_train_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_recall_command(CLI::App& app);
void add_data_command(CLI::App& app);
void add_stats_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_export_command(CLI::App& app);
void add_launch_command(CLI::App& app);

}  // namespace cqk::cli
