#pragma once
// The progress display of long work: one line rewritten in place on a
// terminal, plain periodic lines otherwise (logs, CI, pipes).
#include <chrono>
#include <cstdint>
#include <string>

namespace cqk {

class ProgressLine {
 public:
  // `every`: line interval when not a terminal; `unit`: what is counted ("step i/N").
  ProgressLine(int64_t total, int64_t first, int64_t every, std::string unit = "step");
  // `detail`: what follows "step i/N" (loss, tokens/s, ...); the ETA is added here.
  void update(int64_t done, const std::string& detail);
  void finish();  // ends the in-place line
  static std::string format_duration(double seconds);

 private:
  int64_t total_, first_, every_;
  std::string unit_;
  bool terminal_;
  bool open_line_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace cqk
