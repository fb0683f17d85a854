// The README's code as printed. The Python block that reads model.pt runs in a
// folder where `cqk train` left runs/default-seed1/model.pt; the C++ block is
// built and run against the installed package by consumer.find_package
// (tests/consumer/run_consumer.cmake).
#include <gtest/gtest.h>
#include <unistd.h>

#include <sstream>
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

// A tiny run of the default config (its recall vocabulary, the data the
// README's ids refer to) in the default run folder, runs/default-seed1 under
// `dir`; `paused`: after its first of two steps, for `--resume` to finish.
void train_default_run(const TempDir& dir, bool paused = false) {
  const auto train = run_command(
      "cd " + shell_quote(dir.path()) + " && " + std::string(CQK_TOOL) +
      " --threads 1 train --set model.width=32 --set model.layers=1 --set data.seq_len=16 --set data.batch_size=4"
      " --set data.recall.train_examples=100 --set data.recall.eval_examples=16 --set train.steps=2"
      " --set train.eval_every=100 --set train.device=cpu" + (paused ? " --max-steps 1" : ""));
  ASSERT_EQ(train.exit_code, 0) << train.out;
  const char* made = paused ? "runs/default-seed1/checkpoints/step-000000001.ckpt" : "runs/default-seed1/model.pt";
  ASSERT_FALSE(read_file(dir / made).empty()) << train.out;
}

TEST(Readme, PythonBlockReadsATrainedModelAsPrinted) {
  const std::string python = CQK_PYTHON;
  if (python.empty() || ::access(python.c_str(), X_OK) != 0)
    GTEST_SKIP() << "no torch Python (CQK_PYTHON='" << python << "')";
  const std::string code = readme_block("### Model weights in Python", "python");
  ASSERT_FALSE(code.empty()) << "README.md has no ```python block under '### Model weights in Python'";
  TempDir dir("cqk-readme");
  ASSERT_NO_FATAL_FAILURE(train_default_run(dir));
  write_file(dir / "readme.py", code);
  const auto run = run_command("cd " + shell_quote(dir.path()) + " && " + shell_quote(python) + " readme.py");
  EXPECT_EQ(run.exit_code, 0) << code << "\n" << run.out;
  EXPECT_NE(run.out.find("'embedding.weight': ("), std::string::npos) << run.out;
}

// Every `build/cqk` line of "Using cqk" that works on runs/default-seed1 (eval,
// generate, inspect, resume) runs as printed, in order, on a run of the default
// config paused for the resume line to finish.
TEST(Readme, CommandsOnTheDefaultRunWorkAsPrinted) {
  const std::string block = readme_block("## Using cqk", "sh");
  ASSERT_FALSE(block.empty()) << "README.md has no ```sh block under '## Using cqk'";
  TempDir dir("cqk-readme");
  ASSERT_NO_FATAL_FAILURE(train_default_run(dir, /*paused=*/true));
  const std::string tool = "build/cqk ", run = "runs/default-seed1";
  int commands = 0;
  std::istringstream lines(block);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(tool, 0) != 0 || line.find(run) == std::string::npos) continue;
    const std::string command = line.substr(tool.size(), line.find("  #") - tool.size());
    SCOPED_TRACE(command);
    const auto result = run_command("cd " + shell_quote(dir.path()) + " && " + std::string(CQK_TOOL) +
                                    " --threads 1 " + command);
    EXPECT_EQ(result.exit_code, 0) << result.out;
    ++commands;
  }
  EXPECT_GE(commands, 4);
}

}  // namespace
