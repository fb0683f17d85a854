#pragma once
// Finite-difference gradient check in float64, in the spirit of torch.autograd.gradcheck:
// compares autograd's gradient of sum(f() * w), w a fixed random weighting, with
// central differences at sampled elements of each input.
#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <functional>
#include <string>
#include <vector>

namespace cqk::testing {

struct GradientCheckResult {
  bool ok = true;
  std::string report;  // the first mismatch, if any
};

GradientCheckResult check_gradients(const std::function<at::Tensor()>& f, const std::vector<at::Tensor>& inputs,
                                    int samples_per_input = 12, double eps = 1e-6, double atol = 1e-7,
                                    double rtol = 1e-5);

}  // namespace cqk::testing
