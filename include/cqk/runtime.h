#pragma once

namespace cqk {

// Sets torch's intra-op thread count and returns it. `requested` <= 0 means
// $CQK_NUM_THREADS if set, otherwise the cores this process may run on
// (sched_getaffinity, so container and taskset limits are honoured).
// Torch's own default depends on the build and the environment, so every
// entry point calls this once, before any tensor work.
int configure_threads(int requested = 0);

// Number of CPUs this process may run on.
int available_cpus();

}  // namespace cqk
