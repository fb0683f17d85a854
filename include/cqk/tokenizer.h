#pragma once
// A sentencepiece BPE tokenizer behind a plain API (no sentencepiece, protobuf or
// torch types here). Implemented in cqk_support, which never sees torch headers.
//
// Models are trained with byte fallback (no text maps to <unk>), character
// coverage 1.0, the identity normaliser, whitespace kept as is and no dummy
// prefix, so decode(encode(text)) == text for any valid UTF-8 text, and the ids
// of consecutive lines concatenate (a line's leading space is its own).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace cqk {

// FNV-1a 64-bit hash; `hash` continues an earlier call.
inline constexpr uint64_t kFnv1aOffset = 0xcbf29ce484222325ULL;
uint64_t fnv1a64(const void* data, std::size_t size, uint64_t hash = kFnv1aOffset);
// FNV-1a 64 of a file's bytes (the tokenizer checksum stored in token files).
// Throws std::runtime_error when the file cannot be read.
uint64_t file_checksum(const std::string& path);
// A checksum as text, "0x" and 16 hex digits (as meta.json and the logs show it).
std::string checksum_hex(uint64_t checksum);

struct TokenizerTrainOptions {
  std::vector<std::string> inputs;  // text files, one sentence/paragraph per line
  int vocab_size = 32000;
  std::string model_path;           // where the .model is written (atomically); a .vocab is written next to it
  int64_t max_sentences = 2000000;  // lines sampled for training (sentencepiece input_sentence_size); 0: all
  int64_t max_sentence_bytes = 1 << 16;  // longer lines are skipped by the trainer
  int threads = 0;                  // 0: the cores this process may run on
  bool verbose = false;             // sentencepiece's own progress log
};

// Trains a BPE model on the lines of `inputs` (read by cqk, streamed into the
// trainer) and writes options.model_path. Throws std::runtime_error on failure.
void train_tokenizer(const TokenizerTrainOptions& options);

class Tokenizer {
 public:
  // Loads a .model file; throws std::runtime_error with the path on failure.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Thread-safe (sentencepiece's encoder is const and reentrant).
  std::vector<int> encode(std::string_view text) const;
  std::string decode(const std::vector<int>& ids) const;

  int vocab_size() const;
  int unk_id() const;
  int bos_id() const;
  int eos_id() const;
  // The byte-fallback piece <0x0A>: `cqk data encode` ends every line with it,
  // so decoding a split reproduces the text file. Falls back to eos_id().
  int newline_id() const;
  std::string piece(int id) const;
  // Per id, the bytes it adds to decoded text: 1 for a byte-fallback piece
  // (<0xE2>: one byte of a character), the length of what decode({id}) gives
  // otherwise (a normal piece with its U+2581 as spaces; 0 for <s>, </s>).
  // So the byte lengths of any valid text's ids sum to the text's length, and
  // a subset of the ids to the bytes of their part of it (bits per byte).
  std::vector<int32_t> piece_byte_lengths() const;

  const std::string& path() const { return path_; }
  uint64_t checksum() const { return checksum_; }  // file_checksum(path())

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
  uint64_t checksum_ = 0;
};

}  // namespace cqk
