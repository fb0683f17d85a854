#include "cqk/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <utility>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files are little-endian; add byte swapping");

namespace cqk {
namespace {

std::string hex(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof(text), "0x%016llx", static_cast<unsigned long long>(value));
  return text;
}

std::string escaped(const unsigned char* bytes, std::size_t n) {
  std::string out = "\"";
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char c = bytes[i];
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char code[8];
      std::snprintf(code, sizeof(code), c == 0 ? "\\0" : "\\x%02x", c);
      out += code;
    }
  }
  return out + "\"";
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("token file " + path + ": " + what);
}

void encode_header(const TokenFileHeader& h, unsigned char* out) {
  std::memset(out, 0, kTokenFileHeaderSize);
  std::memcpy(out, kTokenFileMagic, 8);
  std::memcpy(out + 8, &h.version, 4);
  std::memcpy(out + 12, &h.width, 4);
  std::memcpy(out + 16, &h.count, 8);
  std::memcpy(out + 24, &h.vocab_size, 8);
  std::memcpy(out + 32, &h.tokenizer_checksum, 8);
}

void write_all(int fd, const unsigned char* data, std::size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t written = ::write(fd, data, n);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) fail(path, std::string("write failed: ") + std::strerror(errno));
    data += written;
    n -= static_cast<std::size_t>(written);
  }
}

}  // namespace

uint32_t token_width_for_vocab(uint64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

// --- writing -------------------------------------------------------------------

TokenFileWriter::TokenFileWriter(std::string path, uint64_t vocab_size, uint64_t tokenizer_checksum)
    : path_(std::move(path)) {
  if (vocab_size == 0 || vocab_size > (uint64_t{1} << 32)) fail(path_, "vocab_size " + std::to_string(vocab_size) + " out of range");
  header_.vocab_size = vocab_size;
  header_.width = token_width_for_vocab(vocab_size);
  header_.tokenizer_checksum = tokenizer_checksum;
  tmp_path_ = path_ + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path_, "cannot create " + tmp_path_ + ": " + std::strerror(errno));
  unsigned char placeholder[kTokenFileHeaderSize] = {};
  write_all(fd_, placeholder, sizeof(placeholder), tmp_path_);
  buffer_.reserve(1 << 20);
}

TokenFileWriter::~TokenFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

void TokenFileWriter::append(const int32_t* ids, std::size_t n) {
  const std::size_t width = header_.width;
  for (std::size_t i = 0; i < n; ++i) {
    const int32_t id = ids[i];
    if (id < 0 || static_cast<uint64_t>(id) >= header_.vocab_size)
      throw std::out_of_range("token file " + path_ + ": token id " + std::to_string(id) + " outside [0, " +
                              std::to_string(header_.vocab_size) + ")");
    const auto value = static_cast<uint32_t>(id);
    const std::size_t at = buffer_.size();
    buffer_.resize(at + width);
    std::memcpy(buffer_.data() + at, &value, width);  // little-endian: the low bytes first
    if (buffer_.size() >= (1 << 20)) flush_buffer();
  }
  count_ += n;
}

void TokenFileWriter::flush_buffer() {
  write_all(fd_, buffer_.data(), buffer_.size(), tmp_path_);
  buffer_.clear();
}

void TokenFileWriter::finish() {
  if (fd_ < 0) fail(path_, "finish() called twice");
  flush_buffer();
  header_.count = count_;
  unsigned char bytes[kTokenFileHeaderSize];
  encode_header(header_, bytes);
  if (::pwrite(fd_, bytes, sizeof(bytes), 0) != static_cast<ssize_t>(sizeof(bytes)))
    fail(path_, std::string("cannot write header: ") + std::strerror(errno));
  if (::fsync(fd_) != 0) fail(path_, std::string("fsync failed: ") + std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp_path_.c_str());
    fail(path_, "cannot rename " + tmp_path_ + ": " + why);
  }
  // Make the rename itself durable.
  auto dir = std::filesystem::path(path_).parent_path();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

void write_token_file(const std::string& path, const std::vector<int32_t>& ids, uint64_t vocab_size,
                      uint64_t tokenizer_checksum) {
  TokenFileWriter writer(path, vocab_size, tokenizer_checksum);
  writer.append(ids);
  writer.finish();
}

// --- reading -------------------------------------------------------------------

TokenFile::TokenFile(const std::string& path, std::optional<uint64_t> expected_checksum) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    fail(path, "cannot stat: " + why);
  }
  if (!S_ISREG(st.st_mode)) {  // a folder maps as "No such device"; a pipe has no size
    ::close(fd);
    fail(path, S_ISDIR(st.st_mode) ? "is a directory, expected a file" : "not a regular file");
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < kTokenFileHeaderSize) {
    ::close(fd);
    fail(path, "truncated header: file size expected at least " + std::to_string(kTokenFileHeaderSize) +
                   " bytes, got " + std::to_string(file_size));
  }
  map_ = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail(path, std::string("mmap failed: ") + std::strerror(errno));
  }
  map_size_ = file_size;
  const auto* bytes = static_cast<const unsigned char*>(map_);
  try {
    if (std::memcmp(bytes, kTokenFileMagic, 8) != 0)
      fail(path, "bad magic at offset 0: expected " +
                     escaped(reinterpret_cast<const unsigned char*>(kTokenFileMagic), 8) + ", got " +
                     escaped(bytes, 8) + " (not a cqk token file)");
    std::memcpy(&header_.version, bytes + 8, 4);
    std::memcpy(&header_.width, bytes + 12, 4);
    std::memcpy(&header_.count, bytes + 16, 8);
    std::memcpy(&header_.vocab_size, bytes + 24, 8);
    std::memcpy(&header_.tokenizer_checksum, bytes + 32, 8);
    if (header_.version != kTokenFileVersion)
      fail(path, "unsupported version at offset 8: expected " + std::to_string(kTokenFileVersion) + ", got " +
                     std::to_string(header_.version));
    if (header_.vocab_size == 0 || header_.vocab_size > (uint64_t{1} << 32))
      fail(path, "bad vocab_size at offset 24: expected 1..2^32, got " + std::to_string(header_.vocab_size));
    const uint32_t width = token_width_for_vocab(header_.vocab_size);
    if (header_.width != width)
      fail(path, "bad token width at offset 12: expected " + std::to_string(width) + " for vocab_size " +
                     std::to_string(header_.vocab_size) + ", got " + std::to_string(header_.width));
    const uint64_t payload = file_size - kTokenFileHeaderSize;
    const bool truncated = header_.count > payload / header_.width || payload < header_.count * header_.width;
    if (truncated || payload != header_.count * header_.width)
      fail(path, std::string(truncated ? "truncated" : "trailing bytes after the tokens") +
                     ": file size expected " + std::to_string(kTokenFileHeaderSize) + " + " +
                     std::to_string(header_.count) + " tokens (count at offset 16) x " +
                     std::to_string(header_.width) + " bytes = " +
                     std::to_string(kTokenFileHeaderSize + header_.count * header_.width) + ", got " +
                     std::to_string(file_size));
    if (expected_checksum && *expected_checksum != 0 && *expected_checksum != header_.tokenizer_checksum)
      fail(path, "tokenizer checksum mismatch at offset 32: expected " + hex(*expected_checksum) + ", got " +
                     hex(header_.tokenizer_checksum) + " (encoded with a different tokenizer)");
  } catch (...) {
    unmap();
    throw;
  }
  data_ = bytes + kTokenFileHeaderSize;
}

TokenFile::~TokenFile() { unmap(); }

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)),
      header_(other.header_),
      map_(std::exchange(other.map_, nullptr)),
      map_size_(std::exchange(other.map_size_, 0)),
      data_(std::exchange(other.data_, nullptr)) {}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    header_ = other.header_;
    map_ = std::exchange(other.map_, nullptr);
    map_size_ = std::exchange(other.map_size_, 0);
    data_ = std::exchange(other.data_, nullptr);
  }
  return *this;
}

void TokenFile::unmap() {
  if (map_) ::munmap(map_, map_size_);
  map_ = nullptr;
  data_ = nullptr;
}

namespace {
template <typename Out>
void copy_tokens(const TokenFile& file, const unsigned char* data, int64_t start, int64_t n, Out* out) {
  if (start < 0 || n < 0 || start > file.size() || n > file.size() - start)
    throw std::out_of_range("token file " + file.path() + ": read [" + std::to_string(start) + ", " +
                            std::to_string(start + n) + ") outside [0, " + std::to_string(file.size()) + ")");
  // An id outside the header's vocabulary (a damaged file) would index past the
  // embedding table; it is reported here, naming the file and the position.
  const uint64_t vocab = file.header().vocab_size;
  const auto bad_id = [&](int64_t i, uint64_t id) {
    throw std::runtime_error("token file " + file.path() + ": token " + std::to_string(start + i) + " is " +
                             std::to_string(id) + ", outside the vocabulary [0, " + std::to_string(vocab) +
                             ") of the header (offset 24): the file is damaged");
  };
  if (file.header().width == 2) {
    const auto* src = reinterpret_cast<const uint16_t*>(data) + start;
    for (int64_t i = 0; i < n; ++i) {
      if (src[i] >= vocab) bad_id(i, src[i]);
      out[i] = static_cast<Out>(src[i]);
    }
  } else {
    const auto* src = reinterpret_cast<const uint32_t*>(data) + start;
    for (int64_t i = 0; i < n; ++i) {
      if (src[i] >= vocab) bad_id(i, src[i]);
      out[i] = static_cast<Out>(src[i]);
    }
  }
}
}  // namespace

void TokenFile::read(int64_t start, int64_t n, int64_t* out) const { copy_tokens(*this, data_, start, n, out); }
void TokenFile::read(int64_t start, int64_t n, int32_t* out) const { copy_tokens(*this, data_, start, n, out); }

}  // namespace cqk
