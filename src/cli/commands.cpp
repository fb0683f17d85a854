// The helpers commands.h shares between the subcommands.
#include "commands.h"

#include <stdexcept>

namespace cqk::cli {

int& exit_status() {
  static int status = 0;
  return status;
}

std::string one_line(const std::string& message) { return message.substr(0, message.find('\n')); }

std::function<std::string(const std::string&)> option_check(void (*check)(const std::string&)) {
  return [check](const std::string& value) {
    try {
      check(value);
      return std::string();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
  };
}

}  // namespace cqk::cli
