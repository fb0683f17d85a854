#include "generated_text.h"

#include <random>

namespace cqk::testing {

std::string grammar_text(const std::vector<std::string>& words, unsigned seed, int count) {
  std::mt19937 rng(seed);
  std::string text;
  for (int i = 0; i < count; ++i) {
    text += "the";
    for (int w = 0; w < 6; ++w) text += " " + words[rng() % words.size()];
    text += " .\n";
  }
  return text;
}

}  // namespace cqk::testing
