#pragma once
// Whole-file writes that a crash or a full disk cannot leave half done.
#include <string>

namespace cqk {

// Writes `bytes` to `path` so that `path` holds either its old content or all
// of `bytes`, never a mix: temporary file in the same folder, fsync, rename,
// fsync of the folder. Throws std::runtime_error starting "PATH: " on failure,
// leaving no temporary file behind.
void write_file_atomically(const std::string& path, const std::string& bytes);

}  // namespace cqk
