#include <ATen/ATen.h>
#include <c10/util/Logging.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "saved_model.h"
#include "temp_dir.h"
#include "test_io.h"

// Faults injected into a running `cqk train` (a separate process, one torch
// thread so that every run is bitwise reproducible): SIGINT and SIGTERM save a
// checkpoint and exit 130; SIGKILL at random steps, a full disk during a
// checkpoint write. After each, `cqk train --resume` ends with parameters
// bitwise equal to those of an uninterrupted run: no run is lost.
namespace {

using cqk::testing::folder_entries;
using cqk::testing::read_file;

using cqk::testing::expect_same_weights;
using cqk::testing::TempDir;
using Clock = std::chrono::steady_clock;

constexpr int kSteps = 400;
constexpr int kCheckpointEvery = 10;

// A tiny recall run of kSteps steps (a few seconds on one thread), a metrics
// line every step and a checkpoint every kCheckpointEvery.
std::vector<std::string> train_args(const std::string& run_dir) {
  std::vector<std::string> args = {"--threads", "1", "train"};
  for (const std::string& set : std::vector<std::string>{
           "model.width=32", "model.layers=1", "model.heads=4", "data.seq_len=16", "data.batch_size=4",
        "data.recall.pairs=2", "data.recall.vocab_size=32", "data.recall.train_examples=200",
        "data.recall.eval_examples=16", "train.steps=" + std::to_string(kSteps), "train.warmup_steps=10",
        "train.log_every=1", "train.eval_every=100000", "train.eval_batches=1",
        "train.checkpoint_every=" + std::to_string(kCheckpointEvery), "train.keep_checkpoints=3",
        "train.device=cpu", "run.dir=" + run_dir}) {
    args.push_back("--set");
    args.push_back(set);
  }
  return args;
}

std::vector<std::string> resume_args(const std::string& run_dir) { return {"--threads", "1", "train", "--resume", run_dir}; }

// Checkpoint files (not temporaries) of a run, oldest first.
std::vector<std::string> checkpoints(const std::string& run_dir) {
  std::vector<std::string> found;
  for (const auto& name : folder_entries(run_dir + "/checkpoints"))
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".ckpt") == 0) found.push_back(name);
  return found;
}

std::vector<std::string> temporaries(const std::string& run_dir) {
  std::vector<std::string> found;
  for (const auto& name : folder_entries(run_dir + "/checkpoints"))
    if (name.find(".tmp.") != std::string::npos) found.push_back(name);
  return found;
}

int step_of(const std::string& checkpoint_name) {  // step-000000120.ckpt
  return std::stoi(checkpoint_name.substr(5, 9));
}

// A `cqk` process started with fork and exec, its output in a log file.
class Tool {
 public:
  // file_size_limit > 0: RLIMIT_FSIZE for the child, SIGXFSZ ignored (writes fail with EFBIG, as on a full disk).
  Tool(const std::vector<std::string>& args, const std::string& log_path, rlim_t file_size_limit = 0) {
    std::vector<std::string> argv_strings = {CQK_TOOL};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : argv_strings) argv.push_back(s.data());
    argv.push_back(nullptr);
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {  // only async-signal-safe calls until exec
      const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      const int null = ::open("/dev/null", O_RDONLY);
      if (null >= 0) ::dup2(null, 0);
      if (file_size_limit > 0) {
        ::signal(SIGXFSZ, SIG_IGN);
        const rlimit limit{file_size_limit, file_size_limit};
        ::setrlimit(RLIMIT_FSIZE, &limit);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  ~Tool() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Tool(const Tool&) = delete;
  Tool& operator=(const Tool&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int sig) const { ::kill(pid_, sig); }
  // True once the process has ended (its status then in status()).
  bool done() {
    if (reaped_) return true;
    if (::waitpid(pid_, &status_, WNOHANG) == pid_) reaped_ = true;
    return reaped_;
  }
  // Waits for the end, at most `seconds` (then kills it and throws).
  int wait(double seconds = 120) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    while (!done()) {
      if (Clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status_, 0);
        reaped_ = true;
        throw std::runtime_error("cqk did not finish in time");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return status_;
  }
  int status() const { return status_; }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
};

std::string describe(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

// The highest training step in the metrics lines written after byte `from`.
int metrics_step(const std::string& run_dir, size_t from) {
  const std::string text = read_file(run_dir + "/metrics.jsonl");
  if (text.size() <= from) return 0;
  static const std::regex step("\"step\":([0-9]+)");
  int best = 0;
  for (std::sregex_iterator it(text.begin() + static_cast<std::ptrdiff_t>(from), text.end(), step), end; it != end;
       ++it)
    best = std::max(best, std::stoi((*it)[1]));
  return best;
}

size_t metrics_size(const std::string& run_dir) { return read_file(run_dir + "/metrics.jsonl").size(); }

// Waits until the running process has logged step `target` (true), or has ended (false).
bool wait_for_step(Tool& tool, const std::string& run_dir, size_t from, int target, double seconds = 120) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < deadline) {
    if (metrics_step(run_dir, from) >= target) return true;
    if (tool.done()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  throw std::runtime_error("no step " + std::to_string(target) + " within the time limit");
}

// The uninterrupted run every faulted run must end equal to.
std::string reference_weights(const TempDir& dir) {
  const std::string run = dir / "reference";
  Tool tool(train_args(run), dir / "reference.log");
  const int status = tool.wait();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("reference run: " + describe(status) + "\n" + read_file(dir / "reference.log"));
  return run + "/model.pt";
}

// SIGINT (Ctrl-C) and SIGTERM (a scheduler's stop) mid-run: the run saves a
// checkpoint at the step it was in, says how to continue, and exits 130; the
// resumed run ends exactly where the uninterrupted one does.
TEST(FaultInjection, InterruptAndTerminateSaveACheckpointAndResumeExactly) {
  TempDir dir("cqk-faults");
  const std::string reference = reference_weights(dir);
  for (const int sig : {SIGINT, SIGTERM}) {
    const std::string name = sig == SIGINT ? "sigint" : "sigterm";
    const std::string run = dir / name, log = dir / (name + ".log");
    Tool tool(train_args(run), log);
    ASSERT_TRUE(wait_for_step(tool, run, 0, 45)) << name << ": ended early, " << describe(tool.status()) << "\n"
                                                 << read_file(log);
    tool.signal(sig);
    const int status = tool.wait();
    ASSERT_TRUE(WIFEXITED(status)) << name << ": " << describe(status) << "\n" << read_file(log);
    EXPECT_EQ(WEXITSTATUS(status), 130) << name << "\n" << read_file(log);
    // The checkpoint of the step it stopped at: the newest, and the last step logged.
    const auto saved = checkpoints(run);
    ASSERT_FALSE(saved.empty()) << name;
    const int stopped_at = step_of(saved.back());
    EXPECT_EQ(stopped_at, metrics_step(run, 0)) << name;
    EXPECT_GE(stopped_at, 45) << name;
    EXPECT_LT(stopped_at, kSteps) << name;
    EXPECT_TRUE(temporaries(run).empty()) << name;
    const std::string output = read_file(log);
    EXPECT_NE(output.find("interrupted at step " + std::to_string(stopped_at) + "; checkpoint saved"),
              std::string::npos)
        << output;
    EXPECT_NE(output.find("cqk train --resume " + run), std::string::npos) << output;

    Tool resumed(resume_args(run), log);
    const int resumed_status = resumed.wait();
    ASSERT_TRUE(WIFEXITED(resumed_status) && WEXITSTATUS(resumed_status) == 0)
        << name << ": resume " << describe(resumed_status) << "\n" << read_file(log);
    expect_same_weights(reference, run + "/model.pt", name);
    std::printf("%s at step %d: exit 130, checkpoint step %d, resumed to the same final parameters\n", name.c_str(),
                stopped_at, stopped_at);
  }
}

// Ctrl-C during the final evaluation (whole splits: minutes at scale) ends
// the process at once instead of being ignored until it is over; the last
// checkpoint is saved by then, so `--resume` only evaluates and writes the
// results.
TEST(FaultInjection, InterruptDuringTheFinalEvaluationEndsAtOnceAndResumeFinishes) {
  TempDir dir("cqk-faults");
  const std::string run = dir / "final", log = dir / "final.log";
  auto args = train_args(run);
  // A held-out set large enough that its evaluation takes seconds, and a short run.
  for (const std::string set : {"data.recall.eval_examples=16000", "train.steps=20"}) {
    args.push_back("--set");
    args.push_back(set);
  }
  Tool tool(args, log);
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (read_file(log).find("final evaluation:") == std::string::npos) {
    ASSERT_FALSE(tool.done()) << "ended before its final evaluation: " << describe(tool.status()) << "\n"
                              << read_file(log);
    ASSERT_LT(Clock::now(), deadline) << read_file(log);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  tool.signal(SIGINT);
  const int status = tool.wait(10);  // not the whole evaluation
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << describe(status) << "\n" << read_file(log);
  EXPECT_FALSE(std::ifstream(run + "/results.json").good()) << read_file(log);
  ASSERT_FALSE(checkpoints(run).empty());
  EXPECT_EQ(step_of(checkpoints(run).back()), 20);

  Tool resumed(resume_args(run), log);
  const int resumed_status = resumed.wait();
  ASSERT_TRUE(WIFEXITED(resumed_status) && WEXITSTATUS(resumed_status) == 0)
      << describe(resumed_status) << "\n" << read_file(log);
  EXPECT_NE(read_file(run + "/results.json").find("\"steps\": 20"), std::string::npos) << read_file(run + "/results.json");
}

// SIGKILL (no chance to save) at three seeded random steps, the first before
// any checkpoint exists; each time the run is continued the way a user would
// (`--resume` when it has a checkpoint, else started again), and it still ends
// bitwise where the uninterrupted run does.
TEST(FaultInjection, KillAtRandomStepsThenResumeGivesTheSameParameters) {
  TempDir dir("cqk-faults");
  const std::string reference = reference_weights(dir);
  const std::string run = dir / "killed", log = dir / "killed.log";
  std::mt19937 random(20261202);
  std::vector<int> kill_steps = {std::uniform_int_distribution<int>(2, kCheckpointEvery - 1)(random)};
  std::uniform_int_distribution<int> later(kCheckpointEvery, kSteps - 60);
  while (kill_steps.size() < 3) {
    const int step = later(random);
    if (std::find(kill_steps.begin(), kill_steps.end(), step) == kill_steps.end()) kill_steps.push_back(step);
  }
  std::sort(kill_steps.begin(), kill_steps.end());
  std::uniform_int_distribution<int> delay_us(0, 8000);  // lands anywhere in a step, a checkpoint write included

  for (const int target : kill_steps) {
    const bool resume = !checkpoints(run).empty();
    const size_t from = metrics_size(run);
    Tool tool(resume ? resume_args(run) : train_args(run), log);
    ASSERT_TRUE(wait_for_step(tool, run, from, target)) << "ended before step " << target << ": "
                                                        << describe(tool.status()) << "\n" << read_file(log);
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(random)));
    tool.signal(SIGKILL);
    const int status = tool.wait();
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << describe(status);
    const auto saved = checkpoints(run);
    std::printf("SIGKILL after step %d (%s): newest checkpoint %s, %zu temporary file(s) left\n",
                metrics_step(run, from), resume ? "resumed run" : "fresh run",
                saved.empty() ? "none" : saved.back().c_str(), temporaries(run).size());
    // Every checkpoint left behind is whole: the newest one is where the next run starts.
    if (!saved.empty()) {
      EXPECT_LE(step_of(saved.back()), metrics_step(run, from));
    }
  }
  Tool last(checkpoints(run).empty() ? train_args(run) : resume_args(run), log);
  const int status = last.wait();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << describe(status) << "\n" << read_file(log);
  expect_same_weights(reference, run + "/model.pt", "after 3 kills");
  EXPECT_EQ(step_of(checkpoints(run).back()), kSteps);
  // A checkpoint write cut short by a kill leaves a temporary file; the next run removes it.
  EXPECT_TRUE(temporaries(run).empty()) << temporaries(run).front();
}

// A full disk while a checkpoint is written (RLIMIT_FSIZE below a checkpoint's
// size, so the write fails with EFBIG): the run stops with one error line, the
// previous checkpoint is intact, no temporary file is left, and once there is
// room again --resume ends exactly where the uninterrupted run does.
TEST(FaultInjection, FullDiskDuringACheckpointKeepsThePreviousOne) {
  TempDir dir("cqk-faults");
  const std::string reference = reference_weights(dir);
  const std::string run = dir / "full", log = dir / "full.log";
  auto first = train_args(run);
  first.insert(first.begin() + 3, {"--max-steps", "25"});
  Tool paused(first, log);
  ASSERT_EQ(describe(paused.wait()), "exit 0") << read_file(log);
  const auto before = checkpoints(run);
  ASSERT_FALSE(before.empty());
  ASSERT_EQ(step_of(before.back()), 25);
  const std::string newest = read_file(run + "/checkpoints/" + before.back());
  ASSERT_GT(newest.size(), 64u * 1024);

  const std::string full_log = dir / "full-disk.log";
  Tool full(resume_args(run), full_log, 64 * 1024);  // config, log and metrics stay below 64 KiB
  const int status = full.wait();
  const std::string output = read_file(full_log);
  ASSERT_TRUE(WIFEXITED(status)) << describe(status) << "\n" << output;
  EXPECT_EQ(WEXITSTATUS(status), 2) << output;
  EXPECT_NE(output.find("cqk: error: "), std::string::npos) << output;
  EXPECT_NE(output.find("write failed (disk full?); the previous file is untouched"), std::string::npos) << output;
  EXPECT_EQ(output.find("terminate called"), std::string::npos) << output;
  EXPECT_EQ(checkpoints(run), before);
  EXPECT_EQ(read_file(run + "/checkpoints/" + before.back()), newest);
  EXPECT_TRUE(temporaries(run).empty());

  Tool resumed(resume_args(run), log);
  ASSERT_EQ(describe(resumed.wait()), "exit 0") << read_file(log);
  expect_same_weights(reference, run + "/model.pt", "after a full disk");
}

// A CPU allocation that fails (memory exhausted) throws a c10::Error that the
// tool reports in one line, rather than aborting: c10's CAFFE_ENFORCE is fatal
// only while FLAGS_caffe2_use_fatal_for_enforce is set, and libsentencepiece,
// loaded into the same process, used to set it by writing its own flag over it
// (see src/CMakeLists.txt; `cqk train` with a huge model.width is the end-to-end
// case, tests/bad_inputs/cases.yaml: huge-width).
TEST(FaultInjection, FailedCpuAllocationThrowsInsteadOfAborting) {
  EXPECT_FALSE(FLAGS_caffe2_use_fatal_for_enforce);
  try {
    const auto huge = at::empty({int64_t{1} << 42}, at::kFloat);  // 16 TiB
    ADD_FAILURE() << "allocated " << huge.numel() << " floats";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("can't allocate memory"), std::string::npos)
        << e.what_without_backtrace();
  }
}

}  // namespace
