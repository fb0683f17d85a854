#pragma once
// Comparing a result with its reference: the CPU tests, the emulation tests
// (tests/kernel_emulation/) and the GPU checks (fused_check.h) share it.
#include <ATen/ATen.h>

namespace cqk::testing {

// max |actual - expected| / max |expected|, in float64 (an elementwise relative
// error means nothing where values cross zero). The denominator is floored at
// `floor`: by default 1e-30, so an all-zero reference gives the absolute error
// times 1e30; a test whose reference can be all zero (a single token's q
// gradient) passes the scale below which its error counts as absolute.
inline double max_relative_error(const at::Tensor& actual, const at::Tensor& expected, double floor = 1e-30) {
  const auto a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  return ((a - e).abs().max() / e.abs().max().clamp_min(floor)).item<double>();
}

}  // namespace cqk::testing
