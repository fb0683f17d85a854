#include <CLI/CLI.hpp>

#include <cstdlib>
#include <exception>
#include <iostream>

#include "commands.h"
#include "cqk/build_info.h"
#include "cqk/rms_norm.h"
#include "cqk/rope.h"
#include "cqk/runtime.h"
#include "cqk/swiglu.h"
#include "ops/cuda_coupling.h"
#include "simd/simd_variants.h"

namespace {

// Reads every CQK_* switch once, so a bad value ends the tool before a run
// starts; a switch is otherwise read when first used, and one that a run's
// shapes never reach would be ignored.
void check_environment() {
  cqk::keep_freed_memory();
  cqk::cpu::simd_variant();
  cqk::fused_coupling_enabled();
  cqk::fused_rms_norm_enabled();
  cqk::fused_rope_enabled();
  cqk::fused_swiglu_enabled();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    check_environment();
  } catch (const std::exception& e) {
    std::cerr << "cqk: error: " << e.what() << "\n";
    return 2;
  }
  CLI::App app{"cqk: coupled query-key attention on LibTorch"};
  app.require_subcommand(0, 1);
  bool show_version = false;
  int threads = 0;
  app.add_flag("--version", show_version, "Print versions, CUDA and thread information");
  app.add_option("--threads", threads, "CPU threads for torch (default: $CQK_NUM_THREADS, train.threads, or all cores)")
      ->check(cqk::cli::positive_number())
      ->each([](const std::string& value) { setenv("CQK_NUM_THREADS", value.c_str(), 1); });
  cqk::cli::add_train_command(app);
  cqk::cli::add_bench_command(app);
  cqk::cli::add_recall_command(app);
  cqk::cli::add_data_command(app);
  cqk::cli::add_stats_command(app);
  cqk::cli::add_inspect_command(app);
  cqk::cli::add_eval_command(app);
  cqk::cli::add_generate_command(app);
  cqk::cli::add_export_command(app);
  cqk::cli::add_launch_command(app);

  try {
    app.parse(argc, argv);
    // Subcommands run from their callbacks inside parse(); this handles the rest.
    if (show_version) {
      cqk::configure_threads(threads);
      std::cout << cqk::describe(cqk::build_info());
      return 0;
    }
  } catch (const CLI::RuntimeError& e) {
    return app.exit(e);  // a subcommand that reported its error itself
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    // A command line CLI11 rejects: the same one line as any other bad input.
    std::cerr << "cqk: error: " << cqk::cli::one_line(e.what()) << " (see cqk --help)\n";
    return 2;
  } catch (const std::exception& e) {
    // Bad input of any kind ends here: one line, non-zero exit, no stack trace.
    std::cerr << "cqk: error: " << cqk::cli::one_line(e.what()) << "\n";
    return 2;
  }
  if (app.get_subcommands().empty()) {
    std::cout << app.help();
    return 1;
  }
  return cqk::cli::exit_status();
}
