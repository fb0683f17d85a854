#pragma once
// The coupling alone, kernel against ATen: what `cqk bench coupling` runs. The
// affine coupling of q and k laid out as the attention module hands them over
// (a [batch, time, heads, head_dim] projection viewed per head), with random
// weights, forward without autograd and forward+backward, the kernel path
// (CPU kernel on CPU tensors, fused CUDA kernels on CUDA) and the ATen path
// alternated in rounds in one process. docs/KERNELS.md has the figures.
#include <cstdint>
#include <string>

#include "bench/benchmark.h"

namespace cqk {

struct CouplingBenchOptions {
  int64_t batch = 8, heads = 8, time = 256, head_dim = 64;  // the 20M bench config's attention
  int64_t hidden = 8, steps = 2;
  std::string device = "cpu";  // or "cuda", "cuda:1"
  std::string dtype = "fp32";  // or "bf16"
  int64_t repeats = 10;        // timed repetitions per path and round
  int64_t rounds = 3;          // kernel, ATen, kernel, ATen, ...
};

struct CouplingPathTiming {
  bool taken = false;  // the kernel path applies to these inputs (always true for ATen)
  Spread forward, forward_backward;  // milliseconds, over all repetitions of all rounds
};

struct CouplingBenchResult {
  CouplingBenchOptions options;
  std::string device_name;
  std::string kernel_variant;  // which kernel: "cuda", or the CPU kernel's instruction set ("avx512", "avx2", "none")
  int threads = 0;
  CouplingPathTiming kernel, aten;
};

CouplingBenchResult benchmark_coupling(const CouplingBenchOptions& options);
std::string describe(const CouplingBenchResult& result);
std::string to_json(const CouplingBenchResult& result);

}  // namespace cqk
