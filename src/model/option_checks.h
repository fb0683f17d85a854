#pragma once
// The modules' option checks, so that a bad size or number given through the
// C++ API is a one-line std::invalid_argument naming it, not a c10::Error with
// a backtrace or a NaN in every output.
#include <cmath>
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

// Throws "WHO: NAME must be positive and finite, got V" (NaN fails every comparison, so it is tested apart).
inline void check_positive_finite(const char* who, const char* name, double value) {
  if (!(value > 0) || !std::isfinite(value))
    throw std::invalid_argument(std::string(who) + ": " + name + " must be positive and finite, got " +
                                std::to_string(value));
}

}  // namespace cqk
