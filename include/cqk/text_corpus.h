#pragma once
// Text corpora on disk: the WikiText-103 layouts and plain text files.
// Torch-free (cqk_support).
//
// A folder is recognised, in this order, as
//   wikitext-tokens: wiki.train.tokens  wiki.valid.tokens  wiki.test.tokens
//   wikitext-raw:    wiki.train.raw     wiki.valid.raw     wiki.test.raw
//   plain:           train.txt          valid.txt          test.txt
// (the unzipped archive's subfolder, e.g. wikitext-103-raw/, is looked into
// too). When none is present the error lists the expected names. A single
// text file is an evaluation-only corpus (evaluation_corpus).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace cqk {

struct TextCorpus {
  std::string format;  // wikitext-tokens | wikitext-raw | plain | evaluation-only
  std::string dir;     // the folder the files were found in (empty for explicit files)
  std::string train;   // paths (train empty: an evaluation-only corpus)
  std::string valid;
  std::string test;

  // "train" | "valid" | "test" -> path; throws std::invalid_argument otherwise.
  const std::string& split(const std::string& name) const;
};

inline const char* const kCorpusSplits[] = {"train", "valid", "test"};

// Detects the layout of `dir`; throws std::runtime_error naming the folder and
// every accepted file set when none is complete.
TextCorpus detect_corpus(const std::string& dir);

// An out-of-domain evaluation set that is one file (a WikiText-2 validation
// file, say): its valid and test splits are `file`, it has no train split.
// Throws std::runtime_error when `file` is not a regular file.
TextCorpus evaluation_corpus(const std::string& file);

// The words a line counts for word-level perplexity, the WikiText convention:
// its whitespace-separated words (ASCII whitespace) plus one for the line's
// end (the <eos> WikiText counts). Meaningful for word-tokenized text such as
// wiki.*.tokens, where it gives the word counts the literature divides by.
int64_t line_words(std::string_view line);

// Files to train a tokenizer on: a single folder means its corpus's training
// split; otherwise each argument must be a readable text file.
std::vector<std::string> tokenizer_inputs(const std::vector<std::string>& inputs);

// Reads a text file line by line (without the '\n'; a '\r' before it is kept),
// in large blocks. Throws std::runtime_error naming the file when it cannot be opened.
class LineReader {
 public:
  explicit LineReader(const std::string& path);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  bool next(std::string& line);
  int64_t bytes_read() const { return bytes_read_; }
  int64_t file_size() const { return file_size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  std::vector<char> buffer_;
  std::size_t begin_ = 0, end_ = 0;
  bool eof_ = false;
  int64_t bytes_read_ = 0;
  int64_t file_size_ = 0;
};

}  // namespace cqk
