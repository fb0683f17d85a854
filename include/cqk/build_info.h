#pragma once
#include <string>
#include <vector>

namespace cqk {

// What this binary was built with and what it sees at run time (`cqk --version`).
struct BuildInfo {
  std::string cqk_version;
  std::string torch_version;
  bool cuda_compiled = false;  // cqk's own CUDA kernels are linked in
  std::string kernel_architectures;  // what they were compiled for, e.g. "90" or "80;90"
  std::string cuda_runtime;    // libtorch's CUDA runtime version, e.g. "13.0"; empty in a CPU-only torch
  std::string cuda_driver;     // the driver's CUDA version; empty without a driver
  std::string cudnn;           // the cuDNN libtorch was built with, e.g. "9.10.2"; empty without
  int gpus_visible = 0;        // as torch sees them now
  std::vector<std::string> gpus;  // per visible GPU: name, compute capability, memory
  int cpu_threads = 0;         // intra-op threads in use
  std::string blas;            // BLAS a CPU matmul dispatches to
  std::string cpu_kernels;     // the copy of cqk's CPU kernels that runs: avx512, avx2, or none (the ATen ops)
};

BuildInfo build_info();
std::string describe(const BuildInfo& info);

}  // namespace cqk
