#pragma once
// The entry points the fuzz targets (fuzz/*_fuzzer.cpp, built with clang and
// libFuzzer) and tests/fuzz_regression_test.cpp (the normal test binary) share.
// Each takes arbitrary bytes and returns "" when the code under test kept its
// contract, else what went wrong; the fuzz targets abort on a non-empty answer.
//
// config_loader: the bytes are a YAML config, optionally followed by a line
//   "#--set" and one `key.path=value` override per line; load_config_string must
//   either return a valid Config that to_yaml writes and reads back unchanged,
//   or throw a ConfigError with a one-line message. Anything else is a finding.
// token_file: the bytes are a token file (header and tokens); TokenFile must
//   either open it, with every token readable and inside the vocabulary, or
//   throw std::runtime_error "token file PATH: ..." on one line.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

#include "cqk/config_loader.h"
#include "cqk/token_file.h"

namespace cqk::fuzz {

inline std::string one_line_problem(const std::string& kind, const std::string& message) {
  if (message.empty()) return kind + " with an empty message";
  if (message.find('\n') != std::string::npos || message.find('\r') != std::string::npos)
    return kind + " message spans lines: " + message;
  return "";
}

inline std::string config_loader(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  // `inherit:` reads files: nothing from the kernel's pseudo file systems
  // (/dev/zero never ends, /dev/stdin blocks). Relative names resolve below a
  // folder that does not exist.
  for (const char* pseudo : {"/dev", "/proc", "/sys"})
    if (input.find(pseudo) != std::string::npos) return "";
  std::string yaml = input;
  std::vector<std::string> overrides;
  const std::string marker = "\n#--set\n";
  if (const size_t at = input.find(marker); at != std::string::npos) {
    yaml = input.substr(0, at);
    std::string rest = input.substr(at + marker.size());
    for (size_t begin = 0; begin <= rest.size();) {
      const size_t end = std::min(rest.find('\n', begin), rest.size());
      if (end > begin) overrides.push_back(rest.substr(begin, end - begin));
      begin = end + 1;
    }
  }
  const std::string source = "/nonexistent-cqk-fuzz/input.yaml";
  Config config;
  try {
    config = load_config_string(yaml, source, overrides);
  } catch (const ConfigError& e) {
    return one_line_problem("ConfigError", e.what());
  } catch (const std::exception& e) {
    return std::string("not a ConfigError: ") + typeid(e).name() + ": " + e.what();
  }
  // Accepted: it validates, and its YAML reads back to the same config.
  try {
    validate(config);
    const std::string written = to_yaml(config);
    const Config again = load_config_string(written, "<round trip>");
    if (config_hash(again) != config_hash(config) || to_yaml(again) != written)
      return "to_yaml does not read back to the same config:\n" + written + "\n---\n" + to_yaml(again);
  } catch (const std::exception& e) {
    return std::string("an accepted config fails to round-trip: ") + e.what();
  }
  return "";
}

// A memory file, reused across calls, that TokenFile opens by its /proc path.
inline int token_memfd() {
  static const int fd = ::memfd_create("cqk-fuzz-token-file", MFD_CLOEXEC);
  return fd;
}

inline std::string token_file(const uint8_t* data, size_t size) {
  const int fd = token_memfd();
  if (fd < 0) return "memfd_create failed";
  if (::ftruncate(fd, 0) != 0) return "ftruncate failed";
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (n <= 0) return "pwrite failed";
    done += static_cast<size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  for (const std::optional<uint64_t> checksum : {std::optional<uint64_t>(), std::optional<uint64_t>(0x5eedULL)}) {
    try {
      const TokenFile file(path, checksum);
      const int64_t n = file.size();
      if (static_cast<uint64_t>(n) * file.header().width + kTokenFileHeaderSize != size)
        return "opened a file whose size does not match its header";
      // Every token, through the bounds- and vocabulary-checked reader.
      std::vector<int64_t> tokens(static_cast<size_t>(std::min<int64_t>(n, 4096)));
      for (int64_t start = 0; start < n; start += static_cast<int64_t>(tokens.size())) {
        const int64_t count = std::min<int64_t>(n - start, static_cast<int64_t>(tokens.size()));
        try {
          file.read(start, count, tokens.data());
        } catch (const std::runtime_error& e) {
          const std::string message = e.what();
          if (message.find("outside the vocabulary") == std::string::npos) return "read failed: " + message;
          if (const auto problem = one_line_problem("read error", message); !problem.empty()) return problem;
          break;
        }
        for (int64_t i = 0; i < count; ++i)
          if (tokens[static_cast<size_t>(i)] < 0 || tokens[static_cast<size_t>(i)] >= file.vocab_size())
            return "read returned a token outside the vocabulary";
      }
      // Reads outside the file are refused.
      try {
        file.read(n, 1, tokens.data());
        return "read past the end did not throw";
      } catch (const std::out_of_range&) {
      }
    } catch (const std::runtime_error& e) {
      const std::string message = e.what();
      if (message.rfind("token file " + path + ": ", 0) != 0) return "error does not name the file: " + message;
      if (const auto problem = one_line_problem("runtime_error", message); !problem.empty()) return problem;
    } catch (const std::exception& e) {
      return std::string("unexpected exception: ") + typeid(e).name() + ": " + e.what();
    }
  }
  return "";
}

}  // namespace cqk::fuzz
