#include "test_io.h"

#include <dirent.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace cqk::testing {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string readme_block(const std::string& heading, const std::string& language) {
  const std::string readme = read_file(std::string(CQK_SOURCE_DIR) + "/README.md");
  const size_t section = readme.find("\n" + heading + "\n");
  const std::string fence = "\n```" + language + "\n";
  const size_t begin = section == std::string::npos ? section : readme.find(fence, section);
  if (begin == std::string::npos) return "";
  const size_t code = begin + fence.size();
  const size_t end = readme.find("\n```", code);
  return end == std::string::npos ? "" : readme.substr(code, end + 1 - code);
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  if (!out.flush()) throw std::runtime_error("cannot write " + path);
}

std::vector<std::string> folder_entries(const std::string& folder) {
  std::vector<std::string> names;
  if (DIR* dir = ::opendir(folder.c_str())) {
    while (const dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(dir);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

CommandResult run_command(const std::string& command, const std::string& stderr_path) {
  const std::string redirect = stderr_path.empty() ? " 2>&1" : " 2>" + shell_quote(stderr_path);
  CommandResult result;
  std::fflush(nullptr);  // a child must not inherit and flush our buffered output again
  FILE* pipe = ::popen(("{ " + command + "; }" + redirect + " </dev/null").c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("popen failed for: " + command);
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) result.out.append(buffer, n);
  const int status = ::pclose(pipe);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  if (result.exit_code > 128 && result.exit_code < 160) result.signal = result.exit_code - 128;
  if (!stderr_path.empty()) result.err = read_file(stderr_path);
  return result;
}

std::set<std::string> mapped_files(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> files;
  for (std::string line; std::getline(maps, line);) {
    const auto slash = line.find('/');
    if (slash != std::string::npos && line.find(name, slash) != std::string::npos) files.insert(line.substr(slash));
  }
  return files;
}

}  // namespace cqk::testing
