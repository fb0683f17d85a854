// libFuzzer target: cqk::load_config_string (and --set overrides) on arbitrary bytes.
#include <cstdio>
#include <cstdlib>

#include "entry_points.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string problem = cqk::fuzz::config_loader(data, size);
  if (!problem.empty()) {
    std::fprintf(stderr, "config_loader contract broken: %s\n", problem.c_str());
    std::abort();
  }
  return 0;
}
