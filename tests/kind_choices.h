#pragma once
// A kind table's names as the config loader's messages list them ("a|b|c"),
// so that expected error texts follow the tables instead of spelling them.
#include <string>
#include <vector>

namespace cqk::testing {

inline std::string choices(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : "|") + name;
  return text;
}

}  // namespace cqk::testing
