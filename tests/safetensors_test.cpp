#include "cqk/safetensors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

// The layout of safetensors_bytes read back by hand; tests/hf_export_test.cpp
// reads whole exports with the `safetensors` package itself.
namespace {

TEST(Safetensors, HeaderOffsetsAndBytesFollowTheFormat) {
  const auto weights = at::arange(6, at::kFloat).view({2, 3}).t();  // not contiguous: written row-major as shown
  const auto ids = at::tensor({7, -1, 3}, at::kLong);
  const std::string file = cqk::safetensors_bytes({{"w", weights}, {"ids", ids}}, {{"format", "pt"}});
  uint64_t length = 0;
  std::memcpy(&length, file.data(), 8);
  EXPECT_EQ(length % 8, 0u) << "the data starts 8-byte aligned";
  const auto header = nlohmann::json::parse(file.substr(8, length));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["w"]["dtype"], "F32");
  EXPECT_EQ(header["w"]["shape"], nlohmann::json({3, 2}));
  EXPECT_EQ(header["w"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(header["ids"]["dtype"], "I64");
  EXPECT_EQ(header["ids"]["data_offsets"], nlohmann::json({24, 48}));
  ASSERT_EQ(file.size(), 8 + length + 48);
  const char* data = file.data() + 8 + length;
  const auto read_back = at::from_blob(const_cast<char*>(data), {3, 2}, at::kFloat);
  EXPECT_TRUE(at::equal(read_back, weights));
  EXPECT_TRUE(at::equal(at::from_blob(const_cast<char*>(data + 24), {3}, at::kLong), ids));
}

TEST(Safetensors, RefusesWhatTheFormatCannotHold) {
  EXPECT_THROW(cqk::safetensors_bytes({{"z", at::zeros({2}, at::kComplexFloat)}}), std::invalid_argument);
  EXPECT_THROW(cqk::safetensors_bytes({{"a", at::zeros({1})}, {"a", at::zeros({1})}}), std::invalid_argument);
  EXPECT_THROW(cqk::safetensors_bytes({{"__metadata__", at::zeros({1})}}), std::invalid_argument);
}

}  // namespace
