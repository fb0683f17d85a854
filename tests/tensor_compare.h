#pragma once
// Comparing a result with its reference in the numerical tests.
#include <ATen/core/Tensor.h>

namespace cqk::testing {

// max |actual - expected| / max |expected|, in float64 (an elementwise relative
// error means nothing where values cross zero). The denominator is floored at
// `floor`: by default 1e-30, so an all-zero reference gives the absolute error
// times 1e30; a test whose reference can be all zero (a single token's q
// gradient) passes the scale below which its error counts as absolute.
double max_relative_error(const at::Tensor& actual, const at::Tensor& expected, double floor = 1e-30);

}  // namespace cqk::testing
