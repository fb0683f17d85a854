#pragma once
#include <string>

// Logging through spdlog, behind a narrow interface: spdlog's fmt must not
// meet the fmt that torch's headers bundle (see src/CMakeLists.txt).
namespace cqk::log {

void info(const std::string& message);
void warn(const std::string& message);
void error(const std::string& message);

// Also write every message to `path` (the run directory's log), appending.
void add_file(const std::string& path);
void remove_files();
// An error the caller reports itself (on stderr), written to the files only;
// never throws (a file that cannot be written is skipped).
void error_in_files(const std::string& message);

}  // namespace cqk::log
