#pragma once
// An enum's config names as one table, in enum order (coupling_options.h,
// attention_options.h, sdpa_backend.h): the list of names, parsing, printing
// and the config key's choices all read it, so a new kind is one entry.
// Torch-free: the config loader and its fuzzer use it.
#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace cqk {

template <class Kind, std::size_t N>
using KindTable = std::pair<Kind, const char*>[N];

// The table's names, made once per table (the table is the template
// argument, so two tables never share a cache).
template <const auto& table>
const std::vector<std::string>& kind_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& entry : table) out.emplace_back(entry.second);
    return out;
  }();
  return names;
}

// The kind named `name`; throws std::invalid_argument "unknown WHAT 'name' (expected a|b|...)".
template <class Kind, std::size_t N>
Kind parse_kind(const KindTable<Kind, N>& table, const std::string& name, const std::string& what) {
  std::string expected;
  for (const auto& [kind, text] : table) {
    if (name == text) return kind;
    expected += (expected.empty() ? "" : "|") + std::string(text);
  }
  throw std::invalid_argument("unknown " + what + " '" + name + "' (expected " + expected + ")");
}

template <class Kind, std::size_t N>
std::string kind_name(const KindTable<Kind, N>& table, Kind kind) {
  for (const auto& [k, text] : table)
    if (k == kind) return text;
  return "?";
}

}  // namespace cqk
