#pragma once
// Device-side pieces of the fused coupling kernels (coupling_kernels.cu):
// element I/O of 8 channels, the warp-shuffle Reduce of coupling_math.cuh's lane drivers, the
// shared-memory weight views and their packing, and the device query of the
// host launchers. CUDA only (nvcc), no torch.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "coupling_math.cuh"
#include "coupling_kernels.h"
#include "rope_math.cuh"

// The launch and the block's dynamic shared memory, as macros so that the
// emulator of tests/kernel_emulation can run these kernels on the CPU: it
// defines both before it includes a kernel file.
#ifndef CQK_LAUNCH
#define CQK_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#endif
#ifndef CQK_DYNAMIC_SHARED
#define CQK_DYNAMIC_SHARED(name) extern __shared__ __align__(16) float name[]
#endif

namespace cqk::kernels {

// ---------------------------------------------------------------------------
// Element I/O: 8 consecutive channels of a row, to and from float32 registers.

__device__ __forceinline__ void load8(const float* __restrict__ p, float (&v)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ void load8(const __nv_bfloat16* __restrict__ p, float (&v)[8]) {
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  __nv_bfloat162 pairs[4];
  memcpy(pairs, &u, sizeof(u));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(pairs[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ void store8(float* __restrict__ p, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

__device__ __forceinline__ void store8(__nv_bfloat16* __restrict__ p, const float (&v)[8]) {
  __nv_bfloat162 pairs[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) pairs[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  uint4 u;
  memcpy(&u, pairs, sizeof(u));
  *reinterpret_cast<uint4*>(p) = u;
}

__device__ __forceinline__ void store4(float* p, float a, float b, float c, float d) {
  *reinterpret_cast<float4*>(p) = make_float4(a, b, c, d);
}

// ---------------------------------------------------------------------------
// The Reduce and Sink of coupling_math.cuh's lane drivers, GPU versions.

// Sums over the L lanes of a group (aligned runs of L lanes of a warp). The xor
// butterfly leaves the same bits in every lane (a + b == b + a).
template <int L>
struct ShuffleReduce {
  template <int N>
  CQK_HOST_DEVICE void operator()(float (&v)[N]) const {
#if defined(__CUDA_ARCH__)
#pragma unroll
    for (int offset = L / 2; offset > 0; offset /= 2) {
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], offset);
    }
#endif
  }
};

// rope_math.cuh's exchange: the partner lane of a token's group is l ^ L/2.
template <int L>
struct ShuffleExchange {
  template <int N>
  __device__ __forceinline__ void operator()(const float (&x)[N], float (&partner)[N]) const {
#pragma unroll
    for (int i = 0; i < N; ++i) partner[i] = __shfl_xor_sync(0xffffffffu, x[i], L / 2);
  }
};

template <int D, int R>
struct SmemViews {
  const float* base;
  CQK_HOST_DEVICE PackedStepView<D, R> operator()(int i) const {
    return PackedStepView<D, R>{base + i * PackedStepLayout<D, R>::kFloats};
  }
};

// Step s's weights of one group, in the torch layout in global memory.
template <int D, int R>
__device__ __forceinline__ AffineStepWeights group_step_weights(const AffineCouplingParams& p, int s, int64_t group) {
  return {p.w1[s] + group * R * D, p.b1[s] + group * R, p.w2[s] + group * 2 * D * R, p.b2[s] + group * 2 * D};
}

// The same weights read where they are, for a kernel whose shared memory
// has no room for them (the loads go through L1).
template <int D, int R>
struct GlobalViews {
  const AffineCouplingParams* params;
  int64_t group;
  __device__ DenseStepView<D, R> operator()(int s) const {
    return DenseStepView<D, R>{group_step_weights<D, R>(*params, s, group)};
  }
};

// Packs one group's weights of every step into shared memory (PackedStepLayout),
// the whole block in parallel; the caller synchronises.
template <int D, int R>
__device__ void pack_weights(float* smem, const AffineCouplingParams& p, int64_t group) {
  using Layout = PackedStepLayout<D, R>;
  for (int s = 0; s < p.num_steps; ++s) {
    const AffineStepWeights w = group_step_weights<D, R>(p, s, group);
    for (int o = threadIdx.x; o < Layout::kFloats; o += blockDim.x) smem[s * Layout::kFloats + o] = Layout::gather(w, o);
  }
}
// ---------------------------------------------------------------------------
// Host side: the compiled shapes, and what the launchers need to know about
// the current device.

template <class T>
struct TypeTag {
  using type = T;
};

// Calls f(integral_constant<D>, integral_constant<R>, TypeTag<T>) for the
// compiled head dims D (64, 128), hidden widths R (8, 16) and element types;
// std::invalid_argument "<who>: ..." for any other shape.
template <class F>
void dispatch_compiled_shape(const CouplingShape& s, ElementType type, const char* who, F&& f) {
  auto with_type = [&](auto d, auto r) {
    if (type == ElementType::BFloat16) f(d, r, TypeTag<__nv_bfloat16>{});
    else f(d, r, TypeTag<float>{});
  };
  using I64 = std::integral_constant<int, 64>;
  using I128 = std::integral_constant<int, 128>;
  using I8 = std::integral_constant<int, 8>;
  using I16 = std::integral_constant<int, 16>;
  if (s.head_dim == 64 && s.hidden == 8) with_type(I64{}, I8{});
  else if (s.head_dim == 64 && s.hidden == 16) with_type(I64{}, I16{});
  else if (s.head_dim == 128 && s.hidden == 8) with_type(I128{}, I8{});
  else if (s.head_dim == 128 && s.hidden == 16) with_type(I128{}, I16{});
  else throw std::invalid_argument(std::string(who) + ": unsupported head_dim/hidden " + std::to_string(s.head_dim) +
                                   "/" + std::to_string(s.hidden) + " (compiled: 64 or 128 / 8 or 16)");
}

struct DeviceInfo {
  int multiprocessors = 0;
  int smem_optin = 0;  // bytes a block may use after opting in
};

inline bool query_device(DeviceInfo& info) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // clear it: this is a question, not a failure
    return false;
  }
  static std::mutex mutex;
  static std::unordered_map<int, DeviceInfo> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(device);
  if (it == cache.end()) {
    DeviceInfo fresh;
    if (cudaDeviceGetAttribute(&fresh.multiprocessors, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&fresh.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    it = cache.emplace(device, fresh).first;
  }
  info = it->second;
  return true;
}

// std::runtime_error "<who>: <what>: <CUDA's message>" unless err is cudaSuccess.
inline void check_cuda(cudaError_t err, const char* who, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(who) + ": " + what + ": " + cudaGetErrorString(err));
}

// Lets `kernel` use `bytes` of dynamic shared memory (an opt-in above 48 KB);
// std::invalid_argument "<who>: <shape> needs ..." when the device has fewer.
inline void allow_dynamic_smem(const void* kernel, int64_t bytes, const DeviceInfo& info, const char* who,
                               const std::string& shape) {
  if (bytes > info.smem_optin)
    throw std::invalid_argument(std::string(who) + ": " + shape + " needs " + std::to_string(bytes) +
                                " bytes of shared memory per block, the device allows " +
                                std::to_string(info.smem_optin));
  if (bytes > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
               who, "cudaFuncSetAttribute");
}

}  // namespace cqk::kernels
