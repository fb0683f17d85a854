#include "cqk/progress.h"

#include <unistd.h>

#include <cstdio>

namespace cqk {

ProgressLine::ProgressLine(int64_t total, int64_t first, int64_t every, std::string unit)
    : total_(total),
      first_(first),
      every_(every > 0 ? every : 1),
      unit_(std::move(unit)),
      terminal_(::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()) {}

std::string ProgressLine::format_duration(double seconds) {
  const auto s = static_cast<long long>(seconds + 0.5);
  char text[32];
  if (s >= 3600) std::snprintf(text, sizeof text, "%lldh%02lldm", s / 3600, (s % 3600) / 60);
  else std::snprintf(text, sizeof text, "%lldm%02llds", s / 60, s % 60);
  return text;
}

void ProgressLine::update(int64_t done, const std::string& detail) {
  const bool last = done >= total_;
  if (!terminal_ && !last && done % every_ != 0) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double per_step = done > first_ ? elapsed / static_cast<double>(done - first_) : 0.0;
  const std::string eta = format_duration(per_step * static_cast<double>(total_ - done));
  if (terminal_) {
    std::fprintf(stderr, "\r\033[K%s %lld/%lld | %s | eta %s", unit_.c_str(), static_cast<long long>(done),
                 static_cast<long long>(total_), detail.c_str(), eta.c_str());
    open_line_ = true;
  } else {
    std::fprintf(stderr, "%s %lld/%lld | %s | eta %s\n", unit_.c_str(), static_cast<long long>(done),
                 static_cast<long long>(total_), detail.c_str(), eta.c_str());
  }
  std::fflush(stderr);
}

void ProgressLine::finish() {
  if (open_line_) std::fprintf(stderr, "\n");
  open_line_ = false;
}

}  // namespace cqk
