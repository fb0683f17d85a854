#pragma once
// A run's saved weights (model.pt, torch's pickle of the state dict), read
// back for tests that check two runs ended in exactly the same place.
#include <ATen/ATen.h>

#include <map>
#include <string>

namespace cqk::testing {

// Name -> tensor of the model file at `path`; std::runtime_error if it is missing or empty.
std::map<std::string, at::Tensor> load_state_dict(const std::string& path);

// A gtest failure, prefixed with `label`, unless both files hold the same names with bit-equal tensors.
void expect_same_weights(const std::string& expected_path, const std::string& actual_path, const std::string& label);

}  // namespace cqk::testing
