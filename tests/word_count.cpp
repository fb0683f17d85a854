#include "word_count.h"

#include <sstream>

namespace cqk::testing {

int64_t reference_word_count(const std::string& text) {
  int64_t words = 0;
  std::istringstream lines(text);
  for (std::string line, word; std::getline(lines, line); ++words)
    for (std::istringstream in(line); in >> word;) ++words;
  return words;
}

}  // namespace cqk::testing
