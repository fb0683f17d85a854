// The helpers commands.h shares between the subcommands.
#include "commands.h"

namespace cqk::cli {

int& exit_status() {
  static int status = 0;
  return status;
}

std::string one_line(const std::string& message) { return message.substr(0, message.find('\n')); }

}  // namespace cqk::cli
