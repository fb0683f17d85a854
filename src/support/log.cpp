#include "cqk/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <exception>
#include <memory>

namespace cqk::log {
namespace {

std::shared_ptr<spdlog::logger>& logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    console->set_pattern("%^[%H:%M:%S %l]%$ %v");
    auto made = std::make_shared<spdlog::logger>("cqk", console);
    made->set_level(spdlog::level::info);
    made->flush_on(spdlog::level::info);
    return made;
  }();
  return instance;
}

}  // namespace

void info(const std::string& message) { logger()->info(message); }
void warn(const std::string& message) { logger()->warn(message); }
void error(const std::string& message) { logger()->error(message); }

void add_file(const std::string& path) {
  auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
  file->set_pattern("[%Y-%m-%d %H:%M:%S.%e %l] %v");
  logger()->sinks().push_back(file);
}

void error_in_files(const std::string& message) {
  const auto& sinks = logger()->sinks();
  const spdlog::details::log_msg entry(logger()->name(), spdlog::level::err, message);
  for (std::size_t i = 1; i < sinks.size(); ++i) {  // sinks[0] is the console
    try {
      sinks[i]->log(entry);
      sinks[i]->flush();
    } catch (const std::exception&) {
      // A full disk: the caller's own error, which it reports on stderr, matters more.
    }
  }
}

void remove_files() {
  auto& sinks = logger()->sinks();
  sinks.resize(1);  // the console sink stays
}

}  // namespace cqk::log
