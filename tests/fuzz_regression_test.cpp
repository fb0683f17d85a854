#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../fuzz/entry_points.h"
#include "test_io.h"

// Every input the fuzzers kept (fuzz/corpus/<target>/, minimised) and every
// input that once broke a contract (fuzz/crashes/<target>/), replayed through
// the fuzz targets' own entry points in the normal test binary, so CI covers
// them without clang or libFuzzer (scripts/fuzz.sh, docs/RELIABILITY.md).
namespace {

using cqk::testing::read_file;

const std::string kFuzz = std::string(CQK_SOURCE_DIR) + "/fuzz";

std::vector<std::string> files_in(const std::string& folder) {
  std::vector<std::string> paths;
  if (DIR* dir = ::opendir(folder.c_str())) {
    while (const dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (name[0] != '.') paths.push_back(folder + "/" + name);
    }
    ::closedir(dir);
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

template <typename Entry>
size_t replay(const std::string& target, Entry entry) {
  size_t count = 0;
  for (const std::string kind : {"corpus", "crashes"}) {
    for (const auto& path : files_in(kFuzz + "/" + kind + "/" + target)) {
      const std::string bytes = read_file(path);
      const std::string problem = entry(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      EXPECT_EQ(problem, "") << path;
      ++count;
    }
  }
  return count;
}

TEST(FuzzRegression, ConfigLoaderCorpus) {
  const size_t n = replay("config_loader", cqk::fuzz::config_loader);
  EXPECT_GE(n, 10u) << "fuzz/corpus/config_loader is (nearly) empty";
  std::printf("config_loader: %zu inputs replayed\n", n);
}

TEST(FuzzRegression, TokenFileCorpus) {
  const size_t n = replay("token_file", cqk::fuzz::token_file);
  EXPECT_GE(n, 10u) << "fuzz/corpus/token_file is (nearly) empty";
  std::printf("token_file: %zu inputs replayed\n", n);
}

// The entry points themselves: a good input passes, and a broken contract is
// reported rather than missed (a valid config and a valid token file; the
// contract checks are exercised by the corpus).
TEST(FuzzRegression, EntryPointsAcceptGoodInputs) {
  const std::string yaml = "model:\n  width: 64\n#--set\ntrain.lr=1.0e-3\nrun.name=x\n";
  EXPECT_EQ(cqk::fuzz::config_loader(reinterpret_cast<const uint8_t*>(yaml.data()), yaml.size()), "");
  const std::string bad = "model:\n  widht: 64\n";
  EXPECT_EQ(cqk::fuzz::config_loader(reinterpret_cast<const uint8_t*>(bad.data()), bad.size()), "");

  std::string file(cqk::kTokenFileHeaderSize, '\0');
  std::copy(cqk::kTokenFileMagic, cqk::kTokenFileMagic + 8, file.begin());
  const uint32_t version = 1, width = 2;
  const uint64_t count = 3, vocab = 10;
  file.replace(8, 4, reinterpret_cast<const char*>(&version), 4);
  file.replace(12, 4, reinterpret_cast<const char*>(&width), 4);
  file.replace(16, 8, reinterpret_cast<const char*>(&count), 8);
  file.replace(24, 8, reinterpret_cast<const char*>(&vocab), 8);
  const uint16_t tokens[3] = {1, 2, 9};
  file.append(reinterpret_cast<const char*>(tokens), sizeof tokens);
  EXPECT_EQ(cqk::fuzz::token_file(reinterpret_cast<const uint8_t*>(file.data()), file.size()), "");
  file[64] = 10;  // token 0 becomes 10, outside the vocabulary of 10: an error, not a finding
  EXPECT_EQ(cqk::fuzz::token_file(reinterpret_cast<const uint8_t*>(file.data()), file.size()), "");
}

}  // namespace
