#include "cqk/runtime.h"

#include <ATen/Parallel.h>
#include <sched.h>

#include <cstdlib>
#include <string>

namespace cqk {

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return 1;
}

int configure_threads(int requested) {
  // The environment (also set by the tool's --threads) beats a config's value.
  const char* env = std::getenv("CQK_NUM_THREADS");
  int threads = env ? std::atoi(env) : 0;
  if (threads <= 0) threads = requested;
  if (threads <= 0) threads = available_cpus();
  at::set_num_threads(threads);
  return at::get_num_threads();
}

ProcessSwitch::ProcessSwitch(const char* environment_variable, bool default_on) : on_(default_on) {
  const char* value = std::getenv(environment_variable);
  if (value != nullptr && std::string(value) == "1") on_.store(true);
  if (value != nullptr && std::string(value) == "0") on_.store(false);
}

}  // namespace cqk
