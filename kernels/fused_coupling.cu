#include "coupling_math.cuh"
#include "fused_coupling.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace cqk::kernels {
namespace {

// One thread per token: q and k of the token live in registers for all steps,
// so each is read once and written once.
template <int D, int R, bool Inverse>
__global__ void affine_coupling_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                       float* __restrict__ q_out, float* __restrict__ k_out, int64_t tokens,
                                       int64_t heads, int64_t time, AffineCouplingParams params) {
  const int64_t token = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (token >= tokens) return;
  const int64_t head = (token / time) % heads;
  const int64_t param_head = params.shared_across_heads ? 0 : head;

  AffineStepWeights steps[AffineCouplingParams::kMaxSteps];
  for (int i = 0; i < params.num_steps; ++i) {
    steps[i] = {params.w1[i] + param_head * R * D, params.b1[i] + param_head * R,
                params.w2[i] + param_head * 2 * D * R, params.b2[i] + param_head * 2 * D};
  }
  float qv[D], kv[D];
  for (int d = 0; d < D; ++d) {
    qv[d] = q[token * D + d];
    kv[d] = k[token * D + d];
  }
  if (Inverse) affine_coupling_inverse<D, R>(qv, kv, steps, params.num_steps, params.clamp);
  else affine_coupling_forward<D, R>(qv, kv, steps, params.num_steps, params.clamp);
  for (int d = 0; d < D; ++d) {
    q_out[token * D + d] = qv[d];
    k_out[token * D + d] = kv[d];
  }
}

template <bool Inverse>
void launch(const float* q, const float* k, float* q_out, float* k_out, int64_t batch, int64_t heads, int64_t time,
            int64_t head_dim, int64_t hidden, const AffineCouplingParams& params, void* stream) {
  const int64_t tokens = batch * heads * time;
  if (tokens == 0) return;
  constexpr int kThreads = 128;
  const dim3 grid(static_cast<unsigned>((tokens + kThreads - 1) / kThreads));
  auto s = static_cast<cudaStream_t>(stream);
  if (head_dim == 64 && hidden == 8) {
    affine_coupling_kernel<64, 8, Inverse><<<grid, kThreads, 0, s>>>(q, k, q_out, k_out, tokens, heads, time, params);
  } else if (head_dim == 128 && hidden == 8) {
    affine_coupling_kernel<128, 8, Inverse><<<grid, kThreads, 0, s>>>(q, k, q_out, k_out, tokens, heads, time, params);
  } else {
    throw std::invalid_argument("fused coupling: unsupported head_dim " + std::to_string(head_dim) + " / hidden " +
                                std::to_string(hidden) + " (supported: 64/8, 128/8)");
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string("fused coupling launch: ") + cudaGetErrorString(err));
}

}  // namespace

bool fused_coupling_supported(int64_t head_dim, int64_t hidden) {
  return (head_dim == 64 || head_dim == 128) && hidden == 8;
}

void affine_coupling_forward_cuda(const float* q, const float* k, float* q_out, float* k_out, int64_t batch,
                                  int64_t heads, int64_t time, int64_t head_dim, int64_t hidden,
                                  const AffineCouplingParams& params, void* stream) {
  launch<false>(q, k, q_out, k_out, batch, heads, time, head_dim, hidden, params, stream);
}

void affine_coupling_inverse_cuda(const float* q, const float* k, float* q_out, float* k_out, int64_t batch,
                                  int64_t heads, int64_t time, int64_t head_dim, int64_t hidden,
                                  const AffineCouplingParams& params, void* stream) {
  launch<true>(q, k, q_out, k_out, batch, heads, time, head_dim, hidden, params, stream);
}

}  // namespace cqk::kernels
