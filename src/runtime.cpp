#include "cqk/runtime.h"

#include <ATen/Parallel.h>
#include <malloc.h>
#include <sched.h>

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>

namespace cqk {

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return 1;
}

namespace {

// $CQK_NUM_THREADS, 0 when unset or empty; a typo stops rather than silently
// running on every core.
int threads_from_environment() {
  const char* env = std::getenv("CQK_NUM_THREADS");
  if (env == nullptr || *env == '\0') return 0;
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(env, &end, 10);
  if (*end != '\0' || errno != 0 || value <= 0 || value > std::numeric_limits<int>::max())
    throw std::invalid_argument(std::string("CQK_NUM_THREADS must be a positive integer, got '") + env + "'");
  return static_cast<int>(value);
}

}  // namespace

int configure_threads(int requested) {
  // The environment (also set by the tool's --threads) beats a config's value.
  int threads = threads_from_environment();
  if (threads <= 0) threads = requested;
  if (threads <= 0) threads = available_cpus();
  at::set_num_threads(threads);
  return at::get_num_threads();
}

bool keep_freed_memory() {
  static const ProcessSwitch enabled("CQK_KEEP_FREED_MEMORY", true);
  if (!enabled.on()) return false;
  // mallopt returns 1 on success; both settings are needed: no mmap'd blocks, no trimming.
  return mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max()) == 1;
}

ProcessSwitch::ProcessSwitch(const char* environment_variable, bool default_on) : on_(default_on) {
  const char* value = std::getenv(environment_variable);
  if (value == nullptr || *value == '\0') return;
  if (std::string(value) != "0" && std::string(value) != "1")
    throw std::invalid_argument(std::string(environment_variable) + " must be 0 or 1, got '" + value + "'");
  on_.store(std::string(value) == "1");
}

}  // namespace cqk
