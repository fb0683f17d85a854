#include "saved_model.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <map>
#include <stdexcept>
#include <vector>

#include "test_io.h"

namespace cqk::testing {

namespace {

// Name -> tensor of the model file at `path`; std::runtime_error if it is missing or empty.
std::map<std::string, at::Tensor> load_state_dict(const std::string& path) {
  const auto bytes = read_file(path);
  if (bytes.empty()) throw std::runtime_error("no " + path);
  const auto value = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  std::map<std::string, at::Tensor> result;
  for (const auto& entry : value.toGenericDict()) result[entry.key().toStringRef()] = entry.value().toTensor();
  return result;
}

}  // namespace

void expect_same_weights(const std::string& expected_path, const std::string& actual_path, const std::string& label) {
  const auto expected = load_state_dict(expected_path);
  const auto actual = load_state_dict(actual_path);
  ASSERT_FALSE(expected.empty()) << label;
  ASSERT_EQ(actual.size(), expected.size()) << label;
  for (const auto& [name, tensor] : expected) {
    ASSERT_TRUE(actual.count(name)) << label << ": " << name;
    EXPECT_TRUE(at::equal(actual.at(name), tensor)) << label << ": " << name << " differs";
  }
}

}  // namespace cqk::testing
