#pragma once
// Token files (`cqk data encode` writes train.bin, valid.bin, test.bin): a
// 64-byte little-endian header followed by `count` token ids of `width` bytes.
//
//   offset  size  field
//        0     8  magic "CQKTOK\0\0"
//        8     4  version (1)
//       12     4  width: bytes per token, 2 (uint16, vocab <= 65536) or 4 (uint32)
//       16     8  count: tokens in the file
//       24     8  vocab_size
//       32     8  tokenizer_checksum: FNV-1a 64 of the tokenizer's .model bytes (0: none)
//       40    24  reserved, zero
//
// Readers memory-map the file. Every validation failure throws
// std::runtime_error with one line naming the file, the field and its offset,
// and the expected and the actual value.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cqk {

inline constexpr char kTokenFileMagic[8] = {'C', 'Q', 'K', 'T', 'O', 'K', '\0', '\0'};
inline constexpr uint32_t kTokenFileVersion = 1;
inline constexpr std::size_t kTokenFileHeaderSize = 64;

struct TokenFileHeader {
  uint32_t version = kTokenFileVersion;
  uint32_t width = 2;
  uint64_t count = 0;
  uint64_t vocab_size = 0;
  uint64_t tokenizer_checksum = 0;
};

// 2 when every id of the vocabulary fits in uint16, else 4.
uint32_t token_width_for_vocab(uint64_t vocab_size);

// Streams tokens into a new token file. The data goes to a temporary file next
// to `path`; finish() writes the header, fsyncs and renames it into place, so a
// reader never sees a partial file. Without finish() the temporary is removed.
class TokenFileWriter {
 public:
  TokenFileWriter(std::string path, uint64_t vocab_size, uint64_t tokenizer_checksum);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  // Ids must lie in [0, vocab_size) (std::out_of_range otherwise).
  void append(const int32_t* ids, std::size_t n);
  void append(const std::vector<int32_t>& ids) { append(ids.data(), ids.size()); }
  uint64_t count() const { return count_; }
  void finish();

 private:
  void flush_buffer();

  std::string path_, tmp_path_;
  int fd_ = -1;
  TokenFileHeader header_;
  uint64_t count_ = 0;
  std::vector<unsigned char> buffer_;
};

// Writes a whole token file at once (atomically, as TokenFileWriter).
void write_token_file(const std::string& path, const std::vector<int32_t>& ids, uint64_t vocab_size,
                      uint64_t tokenizer_checksum = 0);

// A read-only memory map of a validated token file.
class TokenFile {
 public:
  // expected_checksum: when given (and non-zero), the header's tokenizer
  // checksum must equal it.
  explicit TokenFile(const std::string& path, std::optional<uint64_t> expected_checksum = std::nullopt);
  ~TokenFile();
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  const TokenFileHeader& header() const { return header_; }
  int64_t size() const { return static_cast<int64_t>(header_.count); }
  int64_t vocab_size() const { return static_cast<int64_t>(header_.vocab_size); }
  uint64_t tokenizer_checksum() const { return header_.tokenizer_checksum; }

  uint32_t operator[](int64_t i) const {
    return header_.width == 2 ? reinterpret_cast<const uint16_t*>(data_)[i]
                              : reinterpret_cast<const uint32_t*>(data_)[i];
  }
  // Copies tokens [start, start + n) to `out` (bounds-checked: std::out_of_range).
  void read(int64_t start, int64_t n, int64_t* out) const;
  void read(int64_t start, int64_t n, int32_t* out) const;

 private:
  void unmap();

  std::string path_;
  TokenFileHeader header_;
  void* map_ = nullptr;
  std::size_t map_size_ = 0;
  const unsigned char* data_ = nullptr;
};

}  // namespace cqk
