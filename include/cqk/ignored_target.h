#pragma once
// The target value that scores nothing: PyTorch's and Hugging Face's
// ignore_index, so labels masked for either (padding, prompts) work here too.
#include <cstdint>

namespace cqk {

constexpr int64_t kIgnoredTarget = -100;

}  // namespace cqk
