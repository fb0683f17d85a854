#pragma once
#include <atomic>

namespace cqk {

// Sets torch's intra-op thread count and returns it: $CQK_NUM_THREADS if set
// (the tool's --threads sets it), else `requested` if > 0, else the cores this
// process may run on (sched_getaffinity, so taskset and cgroup cpusets count).
// Torch's own default depends on the build and the environment, so every
// entry point calls this once, before any tensor work. Throws
// std::invalid_argument when $CQK_NUM_THREADS is set but not a positive integer.
int configure_threads(int requested = 0);

// Number of CPUs this process may run on.
int available_cpus();

// Makes glibc malloc keep freed memory for reuse instead of returning it to
// the system. By default glibc serves large blocks (a step's activations and
// gradients, megabytes each) with mmap and unmaps them on free, so every
// training step page-faults the same memory in again; with this setting all
// blocks come from the heap and the heap is never trimmed, and the process
// stays at its peak footprint. About 10% of a CPU training step at 20M
// parameters (docs/BENCHMARKS.md). On by default in the `cqk` tool;
// CQK_KEEP_FREED_MEMORY=0 turns it off. Returns whether it is in effect.
bool keep_freed_memory();

// A process-wide on/off switch (which implementation to take, say) whose
// start value comes from an environment variable: "1" on, "0" off, unset or
// empty the default; any other value throws std::invalid_argument naming the
// variable (a typo must not silently select the other implementation).
class ProcessSwitch {
 public:
  ProcessSwitch(const char* environment_variable, bool default_on);
  bool on() const { return on_.load(); }
  void set(bool on) { on_.store(on); }

 private:
  std::atomic<bool> on_;
};

}  // namespace cqk
