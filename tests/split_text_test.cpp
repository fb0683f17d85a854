// scripts/split_text.sh: the deterministic train/valid/test split of one text
// file by blocks of lines (the real-text study's first step, docs/EXPERIMENTS.md).
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "test_io.h"

namespace {

using cqk::testing::read_file;
using cqk::testing::run_command;
using cqk::testing::shell_quote;

std::string script() { return shell_quote(std::string(CQK_SOURCE_DIR) + "/scripts/split_text.sh"); }

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// 230 lines in blocks of 10, 5 parts: blocks 0-22; slot = block % 5; slot 3 is
// valid (blocks 3, 8, 13, 18), slot 4 test (4, 9, 14, 19), the rest train.
TEST(SplitText, BlocksGoToTheirSplitInOrder) {
  cqk::testing::TempDir tmp("cqk-split-text");
  std::string text;
  for (int i = 0; i < 230; ++i) text += "line " + std::to_string(i) + " with some words\n";
  cqk::testing::write_file(tmp / "corpus.txt", text);

  const auto r = run_command(script() + " --block 10 --parts 5 " + shell_quote(tmp / "corpus.txt") + " " +
                             shell_quote(tmp / "out"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::vector<std::string> expected_train, expected_valid, expected_test;
  for (int i = 0; i < 230; ++i) {
    const std::string line = "line " + std::to_string(i) + " with some words";
    const int slot = (i / 10) % 5;
    (slot == 3 ? expected_valid : slot == 4 ? expected_test : expected_train).push_back(line);
  }
  EXPECT_EQ(lines_of(read_file(tmp / "out/train.txt")), expected_train);
  EXPECT_EQ(lines_of(read_file(tmp / "out/valid.txt")), expected_valid);
  EXPECT_EQ(lines_of(read_file(tmp / "out/test.txt")), expected_test);
  EXPECT_NE(r.out.find("train.txt: 150 lines"), std::string::npos) << r.out;

  // Deterministic: a second split of the same file gives the same bytes.
  const auto again = run_command(script() + " --block 10 --parts 5 " + shell_quote(tmp / "corpus.txt") + " " +
                                 shell_quote(tmp / "again"));
  ASSERT_EQ(again.exit_code, 0) << again.out;
  for (const char* name : {"train.txt", "valid.txt", "test.txt"})
    EXPECT_EQ(read_file(tmp / "again/" + name), read_file(tmp / "out/" + name)) << name;
}

TEST(SplitText, RefusesBadInputWithOneLineAndWritesNoSplit) {
  cqk::testing::TempDir tmp("cqk-split-text-bad");
  cqk::testing::write_file(tmp / "short.txt", "one\ntwo\n");
  const auto too_short = run_command(script() + " " + shell_quote(tmp / "short.txt") + " " + shell_quote(tmp / "out"));
  EXPECT_EQ(too_short.exit_code, 2);
  EXPECT_NE(too_short.out.find("valid would be empty"), std::string::npos) << too_short.out;
  EXPECT_TRUE(cqk::testing::folder_entries(tmp / "out").empty());

  const auto missing = run_command(script() + " " + shell_quote(tmp / "nope.txt") + " " + shell_quote(tmp / "out"));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.out.find("nope.txt: no such readable file"), std::string::npos) << missing.out;

  const auto bad_block = run_command(script() + " --block 0 " + shell_quote(tmp / "short.txt") + " " + shell_quote(tmp / "out"));
  EXPECT_EQ(bad_block.exit_code, 2);
  EXPECT_NE(bad_block.out.find("--block '0'"), std::string::npos) << bad_block.out;

  // --help: the script's header (the split rule), exit 0.
  const auto help = run_command(script() + " --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("with the defaults 90% / 5% / 5%"), std::string::npos) << help.out;
}

}  // namespace
