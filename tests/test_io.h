#pragma once
// Files and child processes for the tests that drive the `cqk` tool or scripts
// end to end. POSIX calls rather than std::filesystem iteration, like temp_dir.h.
#include <set>
#include <string>
#include <vector>

namespace cqk::testing {

// The bytes of a file ("" when it cannot be read).
std::string read_file(const std::string& path);
// Writes (replaces) a file; throws std::runtime_error when it cannot.
void write_file(const std::string& path, const std::string& bytes);
// Names in a folder, sorted, without "." and ".." (empty when it cannot be read).
std::vector<std::string> folder_entries(const std::string& folder);
// `text` as one single-quoted shell word.
std::string shell_quote(const std::string& text);
// The code of the first ```language block after the line `heading` of README.md ("" if none).
std::string readme_block(const std::string& heading, const std::string& language);

// The distinct files this process has mapped (/proc/self/maps) whose path
// contains `name`: how many copies of a shared library are loaded.
std::set<std::string> mapped_files(const std::string& name);

struct CommandResult {
  int exit_code = -1;
  int signal = 0;   // the signal that killed the command (directly or as the shell's 128 + N)
  std::string out;  // stdout, with stderr merged in unless stderr_path was given
  std::string err;  // stderr when stderr_path was given
};

// Runs `command` through /bin/sh, stdin from /dev/null. With stderr_path, stderr
// goes to that file and comes back in `err`; otherwise it is merged into `out`.
CommandResult run_command(const std::string& command, const std::string& stderr_path = "");

}  // namespace cqk::testing
