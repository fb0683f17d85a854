#pragma once
// The files of python/cqk_hf/ that `cqk export` copies into a model folder,
// built into the library by src/CMakeLists.txt (so an installed cqk exports too).
#include <cstddef>

namespace cqk::embedded {

struct SourceFile {
  const char* name;
  const char* text;
};
extern const SourceFile kHfModelCode[];
extern const std::size_t kHfModelCodeCount;

}  // namespace cqk::embedded
