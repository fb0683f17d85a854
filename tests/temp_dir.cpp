#include "temp_dir.h"

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace cqk::testing {

namespace {

int remove_entry(const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }

}  // namespace

TempDir::TempDir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "-XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (::mkdtemp(buffer.data()) == nullptr)
    throw std::runtime_error(pattern + ": mkdtemp failed: " + std::strerror(errno));
  path_ = buffer.data();
}

TempDir::~TempDir() { remove_tree(path_); }

bool remove_tree(const std::string& path) {
  struct stat info;
  if (::lstat(path.c_str(), &info) != 0) return errno == ENOENT;
  // FTW_DEPTH: a folder's entries before the folder; FTW_PHYS: links are not followed.
  ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  return ::lstat(path.c_str(), &info) != 0 && errno == ENOENT;
}

}  // namespace cqk::testing
