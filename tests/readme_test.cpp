// The README's code as printed. The Python block that reads model.pt runs in a
// folder where `cqk train` left runs/default-seed1/model.pt; the C++ block is
// built and run against the installed package by consumer.find_package
// (tests/consumer/run_consumer.cmake).
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "temp_dir.h"
#include "test_io.h"

namespace {

using cqk::testing::read_file;
using cqk::testing::readme_block;
using cqk::testing::run_command;
using cqk::testing::shell_quote;
using cqk::testing::TempDir;
using cqk::testing::write_file;

TEST(Readme, PythonBlockReadsATrainedModelAsPrinted) {
  const std::string python = CQK_PYTHON;
  if (python.empty() || ::access(python.c_str(), X_OK) != 0)
    GTEST_SKIP() << "no torch Python (CQK_PYTHON='" << python << "')";
  const std::string code = readme_block("### Model weights in Python", "python");
  ASSERT_FALSE(code.empty()) << "README.md has no ```python block under '### Model weights in Python'";
  TempDir dir("cqk-readme");
  // A tiny run in the default run folder, runs/default-seed1 under the working directory.
  const auto train = run_command(
      "cd " + shell_quote(dir.path()) + " && " + std::string(CQK_TOOL) +
      " --threads 1 train --set model.width=32 --set model.layers=1 --set data.seq_len=16 --set data.batch_size=4"
      " --set data.recall.train_examples=100 --set data.recall.eval_examples=16 --set train.steps=2"
      " --set train.eval_every=100 --set train.device=cpu");
  ASSERT_EQ(train.exit_code, 0) << train.out;
  ASSERT_FALSE(read_file(dir / "runs/default-seed1/model.pt").empty()) << train.out;
  write_file(dir / "readme.py", code);
  const auto run = run_command("cd " + shell_quote(dir.path()) + " && " + shell_quote(python) + " readme.py");
  EXPECT_EQ(run.exit_code, 0) << code << "\n" << run.out;
  EXPECT_NE(run.out.find("'embedding.weight': ("), std::string::npos) << run.out;
}

}  // namespace
