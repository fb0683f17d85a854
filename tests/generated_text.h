#pragma once
// Text for the tests that train on text: sentences of a small grammar, "the"
// and six words drawn from `words`, then " .". Many words in a rigid pattern,
// so a tiny model learns something in a few dozen steps.
#include <string>
#include <vector>

namespace cqk::testing {

// `count` lines, each a sentence ending in '\n'; the same for the same seed.
std::string grammar_text(const std::vector<std::string>& words, unsigned seed, int count);

}  // namespace cqk::testing
