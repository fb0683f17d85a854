#pragma once
// The WikiText word count of a text, computed the plain way (std::istream's
// whitespace splitting, std::getline for lines): the reference for
// text_corpus.h's line_words, which the encoder and word perplexity use.
#include <cstdint>
#include <string>

namespace cqk::testing {

// Whitespace-separated words plus one per line (each '\n'-ended line, and a last line without one).
int64_t reference_word_count(const std::string& text);

}  // namespace cqk::testing
