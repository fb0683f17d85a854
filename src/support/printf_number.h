#pragma once
// One value through one printf conversion, for tables and log lines:
// printf_number("%.3f", x). Kept to one double so the format string cannot
// ask for arguments it does not get.
#include <cstdio>
#include <string>

namespace cqk {

inline std::string printf_number(const char* spec, double value) {
  char text[64];
  std::snprintf(text, sizeof text, spec, value);
  return text;
}

}  // namespace cqk
