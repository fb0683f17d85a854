#pragma once
// Stand-in for CUDA's cuda_runtime.h when the kernels are compiled as C++ for
// the emulator (tests/kernel_emulation/emulator.h): the qualifiers, vector
// types, intrinsics and the few runtime calls the kernels and their launchers use.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "emulator.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

#define threadIdx (::cqk::emulation::thread_index())
#define blockIdx (::cqk::emulation::block_index())
#define blockDim (::cqk::emulation::block_dim())
#define gridDim (::cqk::emulation::grid_dim())

// The hooks of kernels/coupling_device.cuh.
#define CQK_LAUNCH(kernel, grid, block, smem, stream) \
  ::cqk::emulation::Launch(kernel, dim3(grid), dim3(block), static_cast<size_t>(smem))
#define CQK_DYNAMIC_SHARED(name) float* const name = ::cqk::emulation::dynamic_shared()

struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

inline void __syncthreads() { ::cqk::emulation::sync_block(); }
inline float __shfl_xor_sync(unsigned mask, float value, int lane_mask) {
  return ::cqk::emulation::shuffle_xor(mask, value, lane_mask);
}
// Blocks run one at a time on one thread, so a plain add is atomic.
inline float atomicAdd(float* address, float value) {
  const float old = *address;
  *address = old + value;
  return old;
}
template <class T>
inline T __ldg(const T* p) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(T) != 0) {
    std::fprintf(stderr, "cuda emulation: __ldg of a misaligned %zu-byte value\n", sizeof(T));
    std::abort();
  }
  return *p;
}

enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
using cudaStream_t = struct CUstream_st*;
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount, cudaDevAttrMaxSharedMemoryPerBlockOptin };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };

inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int) {
  const auto& d = ::cqk::emulation::device();
  *value = attribute == cudaDevAttrMultiProcessorCount ? d.multiprocessors : d.smem_optin;
  return cudaSuccess;
}
inline cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute, int bytes) {
  if (bytes > ::cqk::emulation::device().smem_optin) return cudaErrorInvalidValue;
  ::cqk::emulation::set_dynamic_shared_limit(kernel, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t err) { return err == cudaSuccess ? "no error" : "invalid value"; }
