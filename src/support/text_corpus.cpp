#include "cqk/text_corpus.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace cqk {
namespace fs = std::filesystem;

namespace {

struct Layout {
  const char* format;
  const char* train;
  const char* valid;
  const char* test;
};

constexpr Layout kLayouts[] = {
    {"wikitext-tokens", "wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens"},
    {"wikitext-raw", "wiki.train.raw", "wiki.valid.raw", "wiki.test.raw"},
    {"plain", "train.txt", "valid.txt", "test.txt"},
};

bool is_file(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

bool find_layout(const fs::path& dir, TextCorpus& out) {
  for (const auto& layout : kLayouts) {
    if (is_file(dir / layout.train) && is_file(dir / layout.valid) && is_file(dir / layout.test)) {
      out.format = layout.format;
      out.dir = dir.string();
      out.train = (dir / layout.train).string();
      out.valid = (dir / layout.valid).string();
      out.test = (dir / layout.test).string();
      return true;
    }
  }
  return false;
}

std::string expected_names() {
  std::string names;
  for (const auto& layout : kLayouts) {
    if (!names.empty()) names += "; or ";
    names += std::string(layout.train) + ", " + layout.valid + ", " + layout.test;
  }
  return names;
}

}  // namespace

const std::string& TextCorpus::split(const std::string& name) const {
  if (name == "train") return train;
  if (name == "valid") return valid;
  if (name == "test") return test;
  throw std::invalid_argument("unknown split '" + name + "' (expected train, valid or test)");
}

TextCorpus detect_corpus(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw std::runtime_error("corpus folder " + dir + " does not exist or is not a folder");
  TextCorpus corpus;
  if (find_layout(dir, corpus)) return corpus;
  // The unpacked archives keep their files in one subfolder (wikitext-103-raw/).
  std::vector<fs::path> subdirs;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_directory(ec)) subdirs.push_back(entry.path());
  std::sort(subdirs.begin(), subdirs.end());
  for (const auto& sub : subdirs)
    if (find_layout(sub, corpus)) return corpus;
  throw std::runtime_error("no text corpus in " + dir + ": expected " + expected_names() +
                           " (in the folder or one subfolder)");
}

TextCorpus evaluation_corpus(const std::string& file) {
  if (!is_file(file)) throw std::runtime_error("evaluation text " + file + " does not exist or is not a file");
  TextCorpus corpus;
  corpus.format = "evaluation-only";
  corpus.valid = corpus.test = file;
  return corpus;
}

int64_t line_words(std::string_view line) {
  int64_t words = 1;  // the line's end
  bool in_word = false;
  for (const char c : line) {
    const bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
    words += !space && !in_word;
    in_word = !space;
  }
  return words;
}

std::vector<std::string> tokenizer_inputs(const std::vector<std::string>& inputs) {
  if (inputs.empty()) throw std::invalid_argument("no tokenizer input given");
  std::error_code ec;
  if (inputs.size() == 1 && fs::is_directory(inputs[0], ec)) return {detect_corpus(inputs[0]).train};
  for (const auto& path : inputs) {
    if (fs::is_directory(path, ec))
      throw std::invalid_argument("tokenizer input " + path + " is a folder; give one folder or text files");
    if (!is_file(path)) throw std::runtime_error("tokenizer input " + path + " does not exist or is not a file");
  }
  return inputs;
}

LineReader::LineReader(const std::string& path) : path_(path), buffer_(1 << 20) {
  file_ = std::fopen(path.c_str(), "rb");
  if (!file_) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  file_size_ = ec ? 0 : static_cast<int64_t>(size);
}

LineReader::~LineReader() {
  if (file_) std::fclose(file_);
}

bool LineReader::next(std::string& line) {
  std::size_t scanned = begin_;
  for (;;) {
    const void* nl = scanned < end_ ? std::memchr(buffer_.data() + scanned, '\n', end_ - scanned) : nullptr;
    if (nl) {
      const auto pos = static_cast<std::size_t>(static_cast<const char*>(nl) - buffer_.data());
      line.assign(buffer_.data() + begin_, pos - begin_);
      bytes_read_ += static_cast<int64_t>(pos + 1 - begin_);
      begin_ = pos + 1;
      return true;
    }
    if (eof_) {
      if (begin_ == end_) return false;
      line.assign(buffer_.data() + begin_, end_ - begin_);
      bytes_read_ += static_cast<int64_t>(end_ - begin_);
      begin_ = end_;
      return true;
    }
    // Keep the partial line, make room, read more.
    const std::size_t pending = end_ - begin_;
    if (begin_ > 0) {
      std::memmove(buffer_.data(), buffer_.data() + begin_, pending);
      begin_ = 0;
      end_ = pending;
    }
    if (end_ == buffer_.size()) buffer_.resize(buffer_.size() * 2);
    scanned = end_;
    const std::size_t got = std::fread(buffer_.data() + end_, 1, buffer_.size() - end_, file_);
    if (got == 0) {
      if (std::ferror(file_)) throw std::runtime_error("cannot read " + path_ + ": " + std::strerror(errno));
      eof_ = true;
    }
    end_ += got;
  }
}

}  // namespace cqk
