#include "tensor_compare.h"

#include <ATen/ATen.h>

namespace cqk::testing {

double max_relative_error(const at::Tensor& actual, const at::Tensor& expected, double floor) {
  const auto a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  return ((a - e).abs().max() / e.abs().max().clamp_min(floor)).item<double>();
}

}  // namespace cqk::testing
