#include <ftw.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cqk/token_file.h"

namespace {
namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "cqk-token-file-XXXXXX").string();
    path = mkdtemp(pattern.data());
  }
  // Not std::filesystem::remove_all: libtorch.so exports its own copy (built
  // with a newer libstdc++) which calls a symbol Debian's libstdc++ lacks and
  // crashes, whichever overload is used.
  ~TempDir() {
    nftw(path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
         FTW_DEPTH | FTW_PHYS);
  }
};

std::vector<int32_t> ramp(int32_t n, int32_t mod) {
  std::vector<int32_t> ids(static_cast<std::size_t>(n));
  for (int32_t i = 0; i < n; ++i) ids[static_cast<std::size_t>(i)] = (i * 7919) % mod;
  return ids;
}

// Overwrites `size` bytes at `offset` of a file.
void patch(const fs::path& path, std::streamoff offset, const void* bytes, std::size_t size) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(offset);
  file.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(size));
}

std::string open_error(const fs::path& path, std::optional<uint64_t> checksum = std::nullopt) {
  try {
    cqk::TokenFile file(path.string(), checksum);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

TEST(TokenFile, RoundTripUint16) {
  TempDir dir;
  const auto path = dir.path / "a.bin";
  const auto ids = ramp(10007, 32000);
  cqk::write_token_file(path.string(), ids, 32000, 0x1234);
  EXPECT_EQ(fs::file_size(path), cqk::kTokenFileHeaderSize + ids.size() * 2);
  cqk::TokenFile file(path.string(), 0x1234);
  EXPECT_EQ(file.header().width, 2u);
  EXPECT_EQ(file.size(), 10007);
  EXPECT_EQ(file.vocab_size(), 32000);
  EXPECT_EQ(file.tokenizer_checksum(), 0x1234u);
  for (std::size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(file[static_cast<int64_t>(i)], static_cast<uint32_t>(ids[i]));
  std::vector<int64_t> window(100);
  file.read(500, 100, window.data());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(window[i], ids[500 + i]);
  EXPECT_THROW(file.read(10000, 8, window.data()), std::out_of_range);
  // Nothing but the file itself is left in the folder (the temporary was renamed).
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 1);
}

TEST(TokenFile, RoundTripUint32WhenTheVocabIsLarge) {
  TempDir dir;
  const auto path = dir.path / "b.bin";
  EXPECT_EQ(cqk::token_width_for_vocab(65536), 2u);
  EXPECT_EQ(cqk::token_width_for_vocab(65537), 4u);
  auto ids = ramp(5000, 100000);
  ids.push_back(99999);
  cqk::write_token_file(path.string(), ids, 100000);
  cqk::TokenFile file(path.string());
  EXPECT_EQ(file.header().width, 4u);
  EXPECT_EQ(fs::file_size(path), cqk::kTokenFileHeaderSize + ids.size() * 4);
  for (std::size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(file[static_cast<int64_t>(i)], static_cast<uint32_t>(ids[i]));
}

TEST(TokenFile, StreamingWriterAndAbandonedWriter) {
  TempDir dir;
  const auto path = dir.path / "c.bin";
  {
    cqk::TokenFileWriter writer(path.string(), 100, 7);
    for (int chunk = 0; chunk < 300; ++chunk) writer.append(ramp(1000, 100));
    EXPECT_THROW(writer.append(std::vector<int32_t>{100}), std::out_of_range);
    EXPECT_THROW(writer.append(std::vector<int32_t>{-1}), std::out_of_range);
    writer.finish();
  }
  EXPECT_EQ(cqk::TokenFile(path.string(), 7).size(), 300000);
  {
    cqk::TokenFileWriter writer((dir.path / "never.bin").string(), 100, 7);
    writer.append(ramp(10, 100));
  }  // no finish(): neither the file nor a temporary remains
  EXPECT_FALSE(fs::exists(dir.path / "never.bin"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 1);
}

TEST(TokenFile, WrongMagicIsReported) {
  TempDir dir;
  const auto path = dir.path / "magic.bin";
  cqk::write_token_file(path.string(), ramp(100, 50), 50);
  patch(path, 0, "GPT2TOK!", 8);
  const auto error = open_error(path);
  expect_contains(error, path.string());
  expect_contains(error, "bad magic at offset 0");
  expect_contains(error, "expected \"CQKTOK\\0\\0\"");
  expect_contains(error, "got \"GPT2TOK!\"");
}

TEST(TokenFile, UnknownVersionIsReported) {
  TempDir dir;
  const auto path = dir.path / "version.bin";
  cqk::write_token_file(path.string(), ramp(100, 50), 50);
  const uint32_t version = 9;
  patch(path, 8, &version, 4);
  const auto error = open_error(path);
  expect_contains(error, path.string());
  expect_contains(error, "unsupported version at offset 8: expected 1, got 9");
}

TEST(TokenFile, TruncatedFileIsReported) {
  TempDir dir;
  const auto path = dir.path / "short.bin";
  cqk::write_token_file(path.string(), ramp(100, 50), 50);
  fs::resize_file(path, fs::file_size(path) - 3);
  auto error = open_error(path);
  expect_contains(error, path.string());
  expect_contains(error, "truncated");
  expect_contains(error, "64 + 100 tokens");
  expect_contains(error, "= 264, got 261");

  fs::resize_file(path, 20);  // not even a header
  error = open_error(path);
  expect_contains(error, "truncated header");
  expect_contains(error, "got 20");

  cqk::write_token_file(path.string(), ramp(100, 50), 50);
  std::ofstream(path, std::ios::app | std::ios::binary) << "xx";
  expect_contains(open_error(path), "trailing bytes");
}

TEST(TokenFile, ForeignTokenizerChecksumIsReported) {
  TempDir dir;
  const auto path = dir.path / "foreign.bin";
  cqk::write_token_file(path.string(), ramp(100, 50), 50, 0xaaaa);
  EXPECT_EQ(open_error(path, 0xaaaa), "");
  EXPECT_EQ(open_error(path), "");  // no expectation given: not checked
  const auto error = open_error(path, 0xbbbb);
  expect_contains(error, path.string());
  expect_contains(error, "tokenizer checksum mismatch at offset 32");
  expect_contains(error, "expected 0x000000000000bbbb, got 0x000000000000aaaa");
}

TEST(TokenFile, EachFailureHasItsOwnMessage) {
  TempDir dir;
  std::vector<std::string> errors;
  for (int kind = 0; kind < 4; ++kind) {
    const auto path = dir.path / ("f" + std::to_string(kind) + ".bin");
    cqk::write_token_file(path.string(), ramp(100, 50), 50, 1);
    const uint32_t bad = 2;
    if (kind == 0) patch(path, 0, "X", 1);
    if (kind == 1) patch(path, 8, &bad, 4);
    if (kind == 2) fs::resize_file(path, 100);
    errors.push_back(open_error(path, kind == 3 ? 2 : 1));
    EXPECT_EQ(errors.back().find('\n'), std::string::npos) << "one line: " << errors.back();
  }
  for (std::size_t i = 0; i < errors.size(); ++i)
    for (std::size_t j = i + 1; j < errors.size(); ++j) EXPECT_NE(errors[i], errors[j]);
  expect_contains(open_error(dir.path / "missing.bin"), "missing.bin: cannot open");
}

}  // namespace
