#pragma once
// A run's saved weights (model.pt, torch's pickle of the state dict), read
// back for tests that check two runs ended in exactly the same place.
#include <string>

namespace cqk::testing {

// A gtest failure, prefixed with `label`, unless both files hold the same names with bit-equal tensors.
void expect_same_weights(const std::string& expected_path, const std::string& actual_path, const std::string& label);

}  // namespace cqk::testing
