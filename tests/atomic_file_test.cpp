// write_file_atomically: the whole new content or the old, never a mix, and
// no temporary file left behind when a write fails.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "cqk/atomic_file.h"
#include "temp_dir.h"
#include "test_io.h"

namespace {

using cqk::testing::folder_entries;
using cqk::testing::read_file;
using cqk::testing::TempDir;

TEST(AtomicFile, WriteReplacesTheWholeFile) {
  TempDir dir("cqk-atomic");
  const auto path = dir / "file.bin";
  cqk::write_file_atomically(path, "old content");
  EXPECT_EQ(read_file(path), "old content");
  const std::string big(1 << 20, 'n');
  cqk::write_file_atomically(path, big);
  EXPECT_EQ(read_file(path), big);
  EXPECT_EQ(folder_entries(dir.path()), std::vector<std::string>{"file.bin"});
  // A folder that does not exist: an error naming the file, nothing created.
  const std::string missing = dir / "no/such/folder/file";
  try {
    cqk::write_file_atomically(missing, "x");
    ADD_FAILURE() << "written";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), missing + ": cannot create: No such file or directory");
  }
  EXPECT_EQ(folder_entries(dir.path()), std::vector<std::string>{"file.bin"});
}

// A write that fails part way (here: the file-size limit, as a full disk
// would) leaves the old file untouched and no temporary file behind. The limit
// is set in a forked child so the test process keeps its own; SIGXFSZ is
// ignored so the write fails with EFBIG instead of killing the child.
TEST(AtomicFile, WriteThatFailsLeavesTheOldFile) {
  TempDir dir("cqk-atomic");
  const auto path = dir / "file.bin";
  const std::string old_content = "old content that must survive";
  cqk::write_file_atomically(path, old_content);

  std::fflush(nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{4096, 4096};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(10);
    try {
      cqk::write_file_atomically(path, std::string(1 << 20, 'n'));
    } catch (const std::runtime_error& e) {
      // The message names the file asked for, not the temporary one.
      const std::string message = e.what();
      ::_exit(message.rfind(path + ": write failed", 0) == 0 && message.find(".tmp.") == std::string::npos ? 1 : 11);
    } catch (...) {
      ::_exit(12);
    }
    ::_exit(0);  // the write was not refused
  }
  // The child of a multi-threaded process could in principle block on a lock
  // held at fork time; give up after 60 s rather than hang the suite.
  int status = 0;
  pid_t waited = 0;
  for (int i = 0; i < 6000 && (waited = ::waitpid(child, &status, WNOHANG)) == 0; ++i) ::usleep(10000);
  if (waited == 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    FAIL() << "the child writing under RLIMIT_FSIZE did not finish";
  }
  ASSERT_EQ(waited, child);
  ASSERT_TRUE(WIFEXITED(status)) << "child killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 1) << "0: no error; 10: setrlimit failed; 11: the message does not start "
                                       "with the file's name; 12: not a std::runtime_error";
  EXPECT_EQ(read_file(path), old_content);
  EXPECT_EQ(folder_entries(dir.path()), std::vector<std::string>{"file.bin"});
}

}  // namespace
