#pragma once
// Test hooks of the data-parallel trainer, read from the environment; both do
// nothing unless set. Private to the library: tests/distributed_test.cpp sets
// the variables and runs `cqk launch`.
#include <torch/nn/module.h>

#include <cstdint>

namespace cqk {

// CQK_DIST_TEST_CRASH_RANK=r CQK_DIST_TEST_CRASH_STEP=s: rank r dies (std::_Exit(9))
// when it is about to run step s + 1, to test that the other ranks fail cleanly.
void crash_rank_for_test_if_requested(int rank, int64_t step);
// CQK_DIST_DUMP_DIR=dir: every rank writes its final weights to dir/rank<r>.pt
// (cqk::save_weights_for_python format), to compare ranks.
void dump_weights_for_test_if_requested(const torch::nn::Module& module, int rank);

}  // namespace cqk
