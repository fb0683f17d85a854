#pragma once
// What the emulation tests share besides the references: the launchers'
// argument structs filled from ATen tensors, the comparison, and the naming
// of (case, run order) test parameters.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <tuple>

#include "emulator.h"
#include "coupling_kernels.h"
#include "reference.h"

namespace cqk::emulation {

kernels::AffineCouplingParams params_of(const CouplingWeights& w, bool shared_across_heads, float clamp);
kernels::AffineCouplingGrads grads_of(CouplingWeights& g);

// Element strides of a 4-d [batch, heads, time, dim] view (dim contiguous).
kernels::RowStrides row_strides(const at::Tensor& x);
kernels::ElementType element_type(const at::Tensor& x);

// Every element of `actual` is finite and max |actual - expected| is at most
// `tolerance` times max(max |expected|, 1e-2) (the floor: an all-zero
// reference, such as the q gradient of a single token, against float32 rounding).
// Fails the current test otherwise.
void expect_close(const at::Tensor& actual, const at::Tensor& expected, double tolerance, const std::string& what);

inline std::ostream& operator<<(std::ostream& os, RunOrder order) { return os << run_order_name(order); }

// Every case runs in both run orders (emulator.h); the test is named "<case>_<order>".
inline auto both_run_orders() { return ::testing::Values(RunOrder::kAscending, RunOrder::kDescending); }
template <class Case>
std::string case_and_order_name(const ::testing::TestParamInfo<std::tuple<Case, RunOrder>>& info) {
  return std::string(std::get<0>(info.param).name) + "_" + run_order_name(std::get<1>(info.param));
}

}  // namespace cqk::emulation
