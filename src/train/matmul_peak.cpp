#include "cqk/matmul_peak.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>

namespace cqk {

double measure_matmul_flops(const c10::Device& device, c10::ScalarType dtype, int64_t size, int repeats) {
  const auto options = at::TensorOptions().device(device).dtype(dtype);
  const auto a = at::randn({size, size}, options), b = at::randn({size, size}, options);
  auto c = at::matmul(a, b);  // warm-up: thread pools, kernels, allocator
  if (device.is_cuda()) torch::cuda::synchronize();
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    c = at::matmul(a, b);
    if (device.is_cuda()) torch::cuda::synchronize();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * static_cast<double>(size * size * size) / best;
}

}  // namespace cqk
