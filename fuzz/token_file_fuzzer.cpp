// libFuzzer target: the token-file header reader (cqk::TokenFile) on arbitrary bytes.
#include <cstdio>
#include <cstdlib>

#include "entry_points.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string problem = cqk::fuzz::token_file(data, size);
  if (!problem.empty()) {
    std::fprintf(stderr, "token_file contract broken: %s\n", problem.c_str());
    std::abort();
  }
  return 0;
}
