#include "cqk/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace cqk {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

// Errors name `path`, the file the user asked for, not the temporary one.
void fsync_file(const std::string& file, int flags, const std::string& path) {
  const int fd = ::open(file.c_str(), flags);
  if (fd < 0) fail(path, std::string("cannot open for fsync: ") + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail(path, std::string("fsync failed: ") + std::strerror(errno));
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& bytes) {
  const std::filesystem::path target(path);
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) fail(path, std::string("cannot create: ") + std::strerror(errno));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      out.close();
      std::remove(temporary.c_str());
      fail(path, "write failed (disk full?); the previous file is untouched");
    }
  }
  try {
    fsync_file(temporary, O_RDONLY, path);
  } catch (...) {
    std::remove(temporary.c_str());
    throw;
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(temporary.c_str());
    fail(path, "rename failed: " + why);
  }
  const auto folder = target.has_parent_path() ? target.parent_path().string() : std::string(".");
  fsync_file(folder, O_RDONLY | O_DIRECTORY, folder);
}

}  // namespace cqk
