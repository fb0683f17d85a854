#pragma once
// One training process per run directory: an exclusive advisory lock
// (flock) on RUN/.lock, held while the run trains. Two `cqk train` pointed at
// one folder before its first checkpoint would otherwise both write into it.
#include <string>

namespace cqk {

class RunLock {
 public:
  // Throws std::runtime_error naming the folder when another process holds it.
  explicit RunLock(const std::string& run_dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace cqk
