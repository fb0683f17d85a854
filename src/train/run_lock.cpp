#include "train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "cqk/log.h"

namespace cqk {

RunLock::RunLock(const std::string& run_dir) {
  const std::string path = (std::filesystem::path(run_dir) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error(path + ": cannot open the run's lock file: " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return;
  const int error = errno;
  if (error == ENOSYS || error == EOPNOTSUPP || error == ENOLCK) {  // a file system without flock (some NFS, FUSE)
    log::warn(path + ": this file system cannot lock (" + std::strerror(error) +
              "); nothing stops a second process training in this folder");
    return;
  }
  ::close(fd_);
  fd_ = -1;
  if (error == EWOULDBLOCK)
    throw std::runtime_error(run_dir + ": another cqk process is training this run; wait for it, or choose another "
                             "run.dir");
  throw std::runtime_error(path + ": cannot lock: " + std::strerror(error));
}

RunLock::~RunLock() { ::close(fd_); }  // closing releases the lock

}  // namespace cqk
