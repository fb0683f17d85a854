#include "rope_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "coupling_device.cuh"  // CQK_LAUNCH, check_cuda
#include "rope_math.cuh"        // rope_channel

namespace cqk::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;
constexpr const char* kWho = "rope";

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }

// One thread per (row, frequency) pair: channels i and i + half of one row,
// grid-strided over every pair of the tensor.
template <class T>
__global__ void __launch_bounds__(kThreads) rope_kernel(const T* __restrict__ x, RowStrides strides,
                                                        CouplingShape shape, const float* __restrict__ cos,
                                                        const float* __restrict__ sin, float sign,
                                                        T* __restrict__ y) {
  const int64_t half = shape.head_dim / 2;
  const int64_t pairs = shape.batch * shape.heads * shape.time * half;
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; n < pairs;
       n += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = n % half, row = n / half;
    const int64_t t = row % shape.time, h = (row / shape.time) % shape.heads, b = row / (shape.time * shape.heads);
    const T* in = x + b * strides.batch + h * strides.head + t * strides.time;
    T* out = y + row * shape.head_dim;
    const float lower = to_float(in[i]), upper = to_float(in[i + half]);
    const float c = cos[t * half + i], s = sign * sin[t * half + i];
    store(out + i, rope_channel(lower, upper, c, s, /*upper_half=*/false));
    store(out + i + half, rope_channel(upper, lower, c, s, /*upper_half=*/true));
  }
}

}  // namespace

void rope_rotate_cuda(ElementType type, const CouplingShape& shape, const void* x, const RowStrides& strides,
                      const float* cos, const float* sin, bool inverse, void* y, void* stream) {
  if (shape.head_dim % 2 != 0)
    throw std::invalid_argument(std::string(kWho) + ": head_dim must be even, got " + std::to_string(shape.head_dim));
  const int64_t pairs = shape.batch * shape.heads * shape.time * (shape.head_dim / 2);
  if (pairs == 0) return;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((pairs + kThreads - 1) / kThreads, kMaxBlocks)));
  auto st = static_cast<cudaStream_t>(stream);
  const float sign = inverse ? -1.0f : 1.0f;
  if (type == ElementType::BFloat16) {
    CQK_LAUNCH(rope_kernel<__nv_bfloat16>, grid, kThreads, 0, st)(static_cast<const __nv_bfloat16*>(x), strides,
                                                                   shape, cos, sin, sign,
                                                                   static_cast<__nv_bfloat16*>(y));
  } else {
    CQK_LAUNCH(rope_kernel<float>, grid, kThreads, 0, st)(static_cast<const float*>(x), strides, shape, cos, sin,
                                                          sign, static_cast<float*>(y));
  }
  check_cuda(cudaGetLastError(), kWho, "launch");
}

}  // namespace cqk::kernels
