#pragma once
#include <string>

namespace cqk {

// What this binary was built with and what it sees at run time (`cqk --version`).
struct BuildInfo {
  std::string cqk_version;
  std::string torch_version;
  bool cuda_compiled = false;  // cqk's own CUDA kernels are linked in
  int gpus_visible = 0;        // as torch sees them now
  int cpu_threads = 0;         // intra-op threads in use
  std::string blas;            // BLAS a CPU matmul dispatches to
};

BuildInfo build_info();
std::string describe(const BuildInfo& info);

}  // namespace cqk
