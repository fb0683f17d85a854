// The helpers commands.h shares between the subcommands.
#include "commands.h"

#include <CLI/CLI.hpp>

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

namespace {

CLI::Validator number_at_least(double minimum, bool inclusive, const std::string& rule, const std::string& name) {
  return CLI::Validator(
      [=](const std::string& text) {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "expected a number, got '" + text + "'";
        const bool ok = inclusive ? value >= minimum : value > minimum;
        return ok ? std::string() : "must be " + rule + ", got " + text;
      },
      name);
}

}  // namespace

CLI::Validator positive_number() { return number_at_least(0, false, "positive", "POSITIVE"); }
CLI::Validator non_negative_number() { return number_at_least(0, true, "at least 0", "NONNEGATIVE"); }

}  // namespace cqk::cli
