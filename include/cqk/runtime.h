#pragma once

namespace cqk {

// Sets torch's intra-op thread count and returns it: $CQK_NUM_THREADS if set
// (the tool's --threads sets it), else `requested` if > 0, else the cores this
// process may run on (sched_getaffinity, so taskset and cgroup cpusets count).
// Torch's own default depends on the build and the environment, so every
// entry point calls this once, before any tensor work.
int configure_threads(int requested = 0);

// Number of CPUs this process may run on.
int available_cpus();

}  // namespace cqk
