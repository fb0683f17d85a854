#include "train/distributed_test_hooks.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "cqk/checkpoint.h"

namespace cqk {
namespace {

std::optional<std::string> environment(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

}  // namespace

void crash_rank_for_test_if_requested(int rank, int64_t step) {
  static const auto crash_rank = environment("CQK_DIST_TEST_CRASH_RANK");
  static const auto crash_step = environment("CQK_DIST_TEST_CRASH_STEP");
  if (!crash_rank || !crash_step) return;
  if (std::to_string(rank) != *crash_rank || std::to_string(step) != *crash_step) return;
  std::fprintf(stderr, "cqk: CQK_DIST_TEST_CRASH_RANK: rank %d exits abruptly before step %lld (test hook)\n", rank,
               static_cast<long long>(step + 1));
  std::fflush(stderr);
  std::_Exit(9);
}

void dump_weights_for_test_if_requested(const torch::nn::Module& module, int rank) {
  const auto dir = environment("CQK_DIST_DUMP_DIR");
  if (!dir) return;
  std::filesystem::create_directories(*dir);
  save_weights_for_python(*dir + "/rank" + std::to_string(rank) + ".pt", module);
}

}  // namespace cqk
