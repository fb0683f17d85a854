#pragma once
// A fresh temporary folder for a test, removed with everything in it when the
// TempDir goes out of scope. POSIX calls (mkdtemp, nftw), not std::filesystem:
// in a binary that links libtorch, std::filesystem::remove_all and
// recursive_directory_iterator resolve to libtorch's own broken copies and crash.
#include <string>

namespace cqk::testing {

class TempDir {
 public:
  // Creates $TMPDIR/<prefix>-XXXXXX (or /tmp/...); throws std::runtime_error on failure.
  explicit TempDir(const std::string& prefix = "cqk-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Deletes `path` and, if it is a folder, everything below it (links are not
// followed). Returns true when nothing is left.
bool remove_tree(const std::string& path);

}  // namespace cqk::testing
