#pragma once
// The modules' size checks, so that a bad size given through the C++ API is a
// one-line std::invalid_argument naming it, not a c10::Error with a backtrace.
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

namespace cqk {

// Throws "WHO: NAME must be positive, got V" for the first size below 1.
inline void check_positive_sizes(const char* who, std::initializer_list<std::pair<const char*, int64_t>> sizes) {
  for (const auto& [name, value] : sizes)
    if (value < 1)
      throw std::invalid_argument(std::string(who) + ": " + name + " must be positive, got " + std::to_string(value));
}

}  // namespace cqk
