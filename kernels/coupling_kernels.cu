// Fused affine coupling: forward, inverse and the backward that rebuilds the
// inputs from the outputs. The per-token math is coupling_math.cuh (run and
// tested on the CPU too); this file is the GPU plumbing around it.
//
// Work split. A token's D channels are spread over a group of L = D/8 threads
// ("lanes"), each holding 8 channels of q and k (and of their gradients) in
// registers: one 16-byte load per tensor in bf16, two in fp32, coalesced over
// the group. The two cross-channel sums per step (W1 x and W2^T g, R values
// each) are warp-shuffle butterflies inside the group. A block of 256 threads
// runs 256/L tokens at a time and loops over a run of tokens that share one set
// of weights (one head, or every head when shared), which it first packs into
// shared memory (PackedStepLayout: conflict-free 128-bit reads).
//
// Backward weight gradients: per step, each token's factors (gsr, gt, x, h,
// ga) are staged in shared memory; the block then sums the outer products over
// the batch of tokens into shared-memory accumulators (each entry owned by one
// thread: no atomics), and at the end adds its accumulators to the global fp32
// gradients with one atomicAdd per entry.
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "coupling_device.cuh"
#include "qk_norm_math.cuh"

namespace cqk::kernels {
namespace {

constexpr int kThreads = 256;

// Stages a token's weight-gradient factors, then (whole block) sums the batch
// into the block's accumulators. Called by every thread of the block at the
// same point (it holds __syncthreads), valid or not.
template <int D, int R>
struct StagingSink {
  float* g2;   // [G][2D]
  float* xs;   // [G][D]
  float* hg;   // [G][2R]
  float* acc;  // [steps][GradLayout::kFloats]
  int slot;    // this group's token within the batch
  bool valid;  // whether that token exists (the batch may be partial)
  int n_valid;

  template <int CPL>
  CQK_HOST_DEVICE void operator()(int step, int c0, const float (&x)[CPL], const float (&gsr)[CPL],
                                  const float (&gt)[CPL], const float (&h)[R], const float (&ga)[R]) const {
#if defined(__CUDA_ARCH__)
    using Grads = GradLayout<D, R>;
    if (valid) {
      float* row = g2 + slot * 2 * D;
#pragma unroll
      for (int i = 0; i < CPL; i += 4) {
        store4(row + c0 + i, gsr[i], gsr[i + 1], gsr[i + 2], gsr[i + 3]);
        store4(row + D + c0 + i, gt[i], gt[i + 1], gt[i + 2], gt[i + 3]);
        store4(xs + slot * D + c0 + i, x[i], x[i + 1], x[i + 2], x[i + 3]);
      }
      if (c0 == 0) {
#pragma unroll
        for (int r = 0; r < R; r += 4) {
          store4(hg + slot * 2 * R + r, h[r], h[r + 1], h[r + 2], h[r + 3]);
          store4(hg + slot * 2 * R + R + r, ga[r], ga[r + 1], ga[r + 2], ga[r + 3]);
        }
      }
    }
    __syncthreads();
    for (int task = threadIdx.x; task < Grads::kTasks; task += blockDim.x)
      weight_grad_task<D, R>(task, n_valid, g2, xs, hg, acc + step * Grads::kFloats);
    __syncthreads();
#endif
  }
};

// ---------------------------------------------------------------------------
// Token addressing. Tokens that share weights form a "group": one head (over
// batch and time), or everything when the weights are shared across heads.

struct Work {
  int64_t batch, heads, time;
  bool shared;
  int64_t group_tokens;      // tokens per group
  int64_t tokens_per_block;  // a multiple of the tokens per batch
  int64_t blocks_per_group;
};

__device__ __forceinline__ void decode(const Work& w, int64_t group, int64_t u, int64_t& b, int64_t& h, int64_t& t) {
  t = u % w.time;
  const int64_t rest = u / w.time;
  if (w.shared) {
    h = rest % w.heads;
    b = rest / w.heads;
  } else {
    h = group;
    b = rest;
  }
}

__device__ __forceinline__ int64_t strided(const RowStrides& s, int64_t b, int64_t h, int64_t t) {
  return b * s.batch + h * s.head + t * s.time;
}

template <int D>
__device__ __forceinline__ int64_t dense(const Work& w, int64_t b, int64_t h, int64_t t) {
  return ((b * w.heads + h) * w.time + t) * D;
}

// This block's share of the work: tokens [begin, end) of one group.
struct BlockTokens {
  int64_t group, begin, end;
};

__device__ __forceinline__ BlockTokens block_tokens(const Work& w) {
  const int64_t group = blockIdx.x / w.blocks_per_group, chunk = blockIdx.x % w.blocks_per_group;
  const int64_t begin = chunk * w.tokens_per_block;
  return {group, begin, begin + w.tokens_per_block < w.group_tokens ? begin + w.tokens_per_block : w.group_tokens};
}

// ---------------------------------------------------------------------------
// Kernels.

template <int D, int R, class T, bool Inverse>
__global__ void __launch_bounds__(kThreads)
    coupling_kernel(const T* __restrict__ q, RowStrides q_strides, const T* __restrict__ k, RowStrides k_strides,
                    T* __restrict__ q_out, T* __restrict__ k_out, Work work, AffineCouplingParams params,
                    AfterCoupling after) {
  constexpr int L = D / kLaneChannels, G = kThreads / L;
  CQK_DYNAMIC_SHARED(smem);
  const BlockTokens block = block_tokens(work);
  pack_weights<D, R>(smem, params, block.group);
  __syncthreads();

  const int lane = threadIdx.x % L, slot = threadIdx.x / L, c0 = lane * kLaneChannels;
  const SmemViews<D, R> views{smem};
  for (int64_t u0 = block.begin; u0 < block.end; u0 += G) {
    // Lanes past the end work on the last token (the shuffles need whole
    // groups) and write nothing.
    const int64_t u = u0 + slot;
    const bool valid = u < block.end;
    int64_t b, h, t;
    decode(work, block.group, valid ? u : block.end - 1, b, h, t);
    float qv[kLaneChannels], kv[kLaneChannels];
    load8(q + strided(q_strides, b, h, t) + c0, qv);
    load8(k + strided(k_strides, b, h, t) + c0, kv);
    if (Inverse) lane_coupling_inverse<R, kLaneChannels>(views, params.num_steps, params.clamp, c0, qv, kv, ShuffleReduce<L>{});
    else lane_coupling_forward<R, kLaneChannels>(views, params.num_steps, params.clamp, c0, qv, kv, ShuffleReduce<L>{});
    // `after` is the same for the whole block, so every lane reduces and shuffles.
    const int64_t o = dense<D>(work, b, h, t) + c0;
    if (after.norm.q) {
      if (valid && after.q_coupled) {  // kept for the backward (none when no gradient is wanted)
        store8(static_cast<T*>(after.q_coupled) + o, qv);
        store8(static_cast<T*>(after.k_coupled) + o, kv);
      }
      lane_rms_norm<D>(qv, after.norm.q + c0, after.norm.eps, ShuffleReduce<L>{});
      lane_rms_norm<D>(kv, after.norm.k + c0, after.norm.eps, ShuffleReduce<L>{});
    }
    if (after.rope.cos) {
      rope_lane<D>(qv, t, c0, after.rope, /*transpose=*/false, ShuffleExchange<L>{});
      rope_lane<D>(kv, t, c0, after.rope, /*transpose=*/false, ShuffleExchange<L>{});
    }
    if (valid) {
      store8(q_out + o, qv);
      store8(k_out + o, kv);
    }
  }
}

// Two blocks per multiprocessor where that costs only a few spilled registers
// (hidden 8: 128 registers, ~50 bytes of spills; uncapped it takes ~146).
// QKNorm: the variant with QK-norm (after.norm set), a separate instantiation
// because its per-lane weight-gradient sums cost registers the others need.
template <int D, int R, class T, bool QKNorm>
__global__ void __launch_bounds__(kThreads, R <= 8 ? 2 : 1)
    coupling_backward_kernel(const T* __restrict__ q_out, const T* __restrict__ k_out, const T* __restrict__ grad_q,
                             RowStrides gq_strides, const T* __restrict__ grad_k, RowStrides gk_strides,
                             T* __restrict__ dq, T* __restrict__ dk, Work work, AffineCouplingParams params,
                             AffineCouplingGrads grads, AfterCoupling after, QKNormGrads norm_grads) {
  constexpr int L = D / kLaneChannels, G = kThreads / L;
  using Layout = PackedStepLayout<D, R>;
  using Grads = GradLayout<D, R>;
  static_assert(static_cast<int>(Layout::kFloats) == static_cast<int>(Grads::kFloats), "one step, one size");
  constexpr int P = Layout::kFloats;
  CQK_DYNAMIC_SHARED(smem);
  const int steps = params.num_steps;
  float* weights = smem;
  float* acc = weights + steps * P;
  float* g2 = acc + steps * P;
  float* xs = g2 + G * 2 * D;
  float* hg = xs + G * D;

  const BlockTokens block = block_tokens(work);
  pack_weights<D, R>(weights, params, block.group);
  for (int o = threadIdx.x; o < steps * P; o += blockDim.x) acc[o] = 0.0f;
  __syncthreads();

  const int lane = threadIdx.x % L, slot = threadIdx.x / L, c0 = lane * kLaneChannels;
  const SmemViews<D, R> views{weights};
  // QK-norm: the weights' gradients for this lane's channels, summed over its tokens.
  float norm_grad_q[QKNorm ? kLaneChannels : 1] = {}, norm_grad_k[QKNorm ? kLaneChannels : 1] = {};
  for (int64_t u0 = block.begin; u0 < block.end; u0 += G) {
    const int64_t u = u0 + slot;
    const bool valid = u < block.end;
    int64_t b, h, t;
    decode(work, block.group, valid ? u : block.end - 1, b, h, t);
    const int64_t o = dense<D>(work, b, h, t) + c0;
    float qv[kLaneChannels], kv[kLaneChannels], gqv[kLaneChannels], gkv[kLaneChannels];
    load8(q_out + o, qv);
    load8(k_out + o, kv);
    load8(grad_q + strided(gq_strides, b, h, t) + c0, gqv);
    load8(grad_k + strided(gk_strides, b, h, t) + c0, gkv);
    if (after.rope.cos) {
      // RoPE came last: the gradients go back through it (R^T), and so do the
      // saved outputs when they are the rotated ones (no QK-norm).
      const ShuffleExchange<L> exchange;
      rope_lane<D>(gqv, t, c0, after.rope, /*transpose=*/true, exchange);
      rope_lane<D>(gkv, t, c0, after.rope, /*transpose=*/true, exchange);
      if (!QKNorm) {
        rope_lane<D>(qv, t, c0, after.rope, /*transpose=*/true, exchange);
        rope_lane<D>(kv, t, c0, after.rope, /*transpose=*/true, exchange);
      }
    }
    if constexpr (QKNorm) {
      // The saved tensors are the coupling's outputs, the norm's inputs.
      float wq[kLaneChannels], wk[kLaneChannels];
      lane_rms_norm_backward<D>(qv, gqv, after.norm.q + c0, after.norm.eps, wq, ShuffleReduce<L>{});
      lane_rms_norm_backward<D>(kv, gkv, after.norm.k + c0, after.norm.eps, wk, ShuffleReduce<L>{});
      if (valid) {
#pragma unroll
        for (int i = 0; i < kLaneChannels; ++i) {
          norm_grad_q[i] += wq[i];
          norm_grad_k[i] += wk[i];
        }
      }
    }
    StagingSink<D, R> sink{g2, xs, hg, acc, slot, valid, static_cast<int>(block.end - u0 < G ? block.end - u0 : G)};
    lane_coupling_backward<R, kLaneChannels>(views, steps, params.clamp, c0, qv, kv, gqv, gkv, ShuffleReduce<L>{},
                                             sink);
    if (valid) {
      store8(dq + o, gqv);
      store8(dk + o, gkv);
    }
  }
  // The sink's last __syncthreads has made every accumulator final.
  if constexpr (QKNorm) {
    // That barrier also freed the staging rows: one row of 2D sums per slot,
    // added up over the slots, then one atomic per channel and block.
#pragma unroll
    for (int i = 0; i < kLaneChannels; ++i) {
      g2[slot * 2 * D + c0 + i] = norm_grad_q[i];
      g2[slot * 2 * D + D + c0 + i] = norm_grad_k[i];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < 2 * D; c += blockDim.x) {
      float sum = 0.0f;
      for (int s = 0; s < G; ++s) sum += g2[s * 2 * D + c];
      atomicAdd(c < D ? norm_grads.q + c : norm_grads.k + (c - D), sum);
    }
  }
  for (int s = 0; s < steps; ++s) {
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
      float* target;
      if (i < Grads::kB1) target = grads.w1[s] + block.group * R * D + i;
      else if (i < Grads::kW2) target = grads.b1[s] + block.group * R + (i - Grads::kB1);
      else if (i < Grads::kB2) target = grads.w2[s] + block.group * 2 * D * R + (i - Grads::kW2);
      else target = grads.b2[s] + block.group * 2 * D + (i - Grads::kB2);
      atomicAdd(target, acc[s * P + i]);
    }
  }
}

// ---------------------------------------------------------------------------
// Host side.

int64_t lanes_per_token(int64_t head_dim) { return head_dim / kLaneChannels; }
int64_t tokens_per_batch(int64_t head_dim) { return kThreads / lanes_per_token(head_dim); }

int64_t step_floats(int64_t d, int64_t r) { return 3 * d * r + r + 2 * d; }

int64_t forward_smem_bytes(int64_t d, int64_t r, int64_t steps) {
  return steps * step_floats(d, r) * static_cast<int64_t>(sizeof(float));
}

size_t element_size(ElementType type) { return type == ElementType::BFloat16 ? 2 : 4; }

constexpr const char* kWho = "fused coupling";

std::string shape_text(const CouplingShape& s, int steps) {
  return "head_dim " + std::to_string(s.head_dim) + ", hidden " + std::to_string(s.hidden) + ", steps " +
         std::to_string(steps);
}

// Tokens each block handles: enough blocks to fill the device several times
// over, enough tokens per block to amortise packing the weights (and, in the
// backward, the atomics of its weight gradients). $CQK_FUSED_TOKENS_PER_BLOCK
// overrides it (for tuning); read at each launch, since the checks set it per case.
int64_t tokens_per_block_override() {
  const char* env = std::getenv("CQK_FUSED_TOKENS_PER_BLOCK");
  if (env == nullptr || *env == '\0') return 0;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(env, &end, 10);
  if (*end != '\0' || errno != 0 || value <= 0)
    throw std::invalid_argument(std::string("CQK_FUSED_TOKENS_PER_BLOCK must be a positive integer, got '") + env +
                                "'");
  return value;
}

int64_t choose_tokens_per_block(int64_t total_tokens, int64_t per_batch, int multiprocessors, int blocks_per_sm) {
  int64_t tokens = tokens_per_block_override();
  if (tokens <= 0) {
    const int64_t target_blocks = static_cast<int64_t>(multiprocessors > 0 ? multiprocessors : 100) * blocks_per_sm;
    tokens = (total_tokens + target_blocks - 1) / target_blocks;
    tokens = std::min<int64_t>(tokens, 64 * per_batch);
  }
  tokens = std::max<int64_t>(tokens, per_batch);
  return (tokens + per_batch - 1) / per_batch * per_batch;
}

// What a launch needs beyond its kernel: the device, the tokens each block
// handles, and a grid of every group's blocks.
struct LaunchPlan {
  DeviceInfo info;
  Work work{};
  dim3 grid;
};

LaunchPlan plan_launch(const CouplingShape& s, bool shared, int blocks_per_sm) {
  LaunchPlan plan;
  if (!query_device(plan.info)) throw std::runtime_error("fused coupling: no CUDA device");
  Work& w = plan.work;
  w.batch = s.batch;
  w.heads = s.heads;
  w.time = s.time;
  w.shared = shared;
  const int64_t groups = shared ? 1 : s.heads;
  w.group_tokens = shared ? s.batch * s.heads * s.time : s.batch * s.time;
  w.tokens_per_block = choose_tokens_per_block(s.batch * s.heads * s.time, tokens_per_batch(s.head_dim),
                                               plan.info.multiprocessors, blocks_per_sm);
  w.blocks_per_group = (w.group_tokens + w.tokens_per_block - 1) / w.tokens_per_block;
  plan.grid = dim3(static_cast<unsigned>(groups * w.blocks_per_group));
  return plan;
}

void validate(const CouplingShape& s, const AffineCouplingParams& params, const AfterCoupling& after) {
  if (!fused_coupling_shape_supported(s.head_dim, s.hidden, params.num_steps))
    throw std::invalid_argument("fused coupling: unsupported " + shape_text(s, params.num_steps) +
                                " (compiled: head_dim 64/128, hidden 8/16, 1.." +
                                std::to_string(AffineCouplingParams::kMaxSteps) + " steps)");
  if (s.batch < 0 || s.heads < 1 || s.time < 0) throw std::invalid_argument("fused coupling: bad batch/heads/time");
  for (int i = 0; i < params.num_steps; ++i)
    if (!params.w1[i] || !params.b1[i] || !params.w2[i] || !params.b2[i])
      throw std::invalid_argument("fused coupling: missing weights of step " + std::to_string(i));
  if ((after.rope.cos == nullptr) != (after.rope.sin == nullptr))
    throw std::invalid_argument("fused coupling: RoPE needs both tables, cos and sin");
  if ((after.norm.q == nullptr) != (after.norm.k == nullptr))
    throw std::invalid_argument("fused coupling: QK-norm needs the weights of both q and k");
}

void require_rows_aligned(const void* p, const RowStrides& strides, ElementType type, const char* name) {
  if (!fused_coupling_rows_aligned(p, strides, type))
    throw std::invalid_argument(std::string("fused coupling: rows of ") + name +
                                " must start on 16-byte boundaries (make it contiguous)");
}

template <bool Inverse>
void launch_forward(ElementType type, const void* q, const RowStrides& qs, const void* k, const RowStrides& ks,
                    void* q_out, void* k_out, const CouplingShape& s, const AffineCouplingParams& params,
                    const AfterCoupling& after, void* stream) {
  validate(s, params, after);
  if (Inverse && (after.norm.q || after.rope.cos))
    throw std::invalid_argument("fused coupling: the inverse applies no QK-norm or RoPE");
  if ((after.q_coupled == nullptr) != (after.k_coupled == nullptr))
    throw std::invalid_argument("fused coupling: q_coupled and k_coupled go together");
  if (after.q_coupled) {
    require_rows_aligned(after.q_coupled, RowStrides::contiguous(s), type, "q_coupled");
    require_rows_aligned(after.k_coupled, RowStrides::contiguous(s), type, "k_coupled");
  }
  if (s.batch * s.heads * s.time == 0) return;
  require_rows_aligned(q, qs, type, "q");
  require_rows_aligned(k, ks, type, "k");
  require_rows_aligned(q_out, RowStrides::contiguous(s), type, "q_out");
  require_rows_aligned(k_out, RowStrides::contiguous(s), type, "k_out");
  const LaunchPlan plan = plan_launch(s, params.shared_across_heads, /*blocks_per_sm=*/8);
  const int64_t smem = forward_smem_bytes(s.head_dim, s.hidden, params.num_steps);
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_compiled_shape(s, type, "fused coupling", [&](auto d, auto r, auto tag) {
    constexpr int D = decltype(d)::value, R = decltype(r)::value;
    using T = typename decltype(tag)::type;
    auto kernel = coupling_kernel<D, R, T, Inverse>;
    allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem, plan.info, kWho, shape_text(s, params.num_steps));
    CQK_LAUNCH(kernel, plan.grid, kThreads, smem, st)(static_cast<const T*>(q), qs, static_cast<const T*>(k), ks,
                                                      static_cast<T*>(q_out), static_cast<T*>(k_out), plan.work,
                                                      params, after);
  });
  check_cuda(cudaGetLastError(), kWho, Inverse ? "inverse launch" : "forward launch");
}

}  // namespace

bool fused_coupling_shape_supported(int64_t head_dim, int64_t hidden, int64_t steps) {
  return (head_dim == 64 || head_dim == 128) && (hidden == 8 || hidden == 16) && steps >= 1 &&
         steps <= AffineCouplingParams::kMaxSteps;
}

int64_t fused_coupling_backward_smem_bytes(int64_t head_dim, int64_t hidden, int64_t steps) {
  const int64_t staging = tokens_per_batch(head_dim) * (3 * head_dim + 2 * hidden);
  return (2 * steps * step_floats(head_dim, hidden) + staging) * static_cast<int64_t>(sizeof(float));
}

bool fused_coupling_supported(int64_t head_dim, int64_t hidden, int64_t steps) {
  if (!fused_coupling_shape_supported(head_dim, hidden, steps)) return false;
  DeviceInfo info;
  return query_device(info) && fused_coupling_backward_smem_bytes(head_dim, hidden, steps) <= info.smem_optin;
}

bool fused_coupling_rows_aligned(const void* data, const RowStrides& strides, ElementType type) {
  const int64_t size = static_cast<int64_t>(element_size(type));
  return reinterpret_cast<uintptr_t>(data) % 16 == 0 && (strides.batch * size) % 16 == 0 &&
         (strides.head * size) % 16 == 0 && (strides.time * size) % 16 == 0;
}

void affine_coupling_forward_cuda(ElementType type, const void* q, const RowStrides& q_strides, const void* k,
                                  const RowStrides& k_strides, void* q_out, void* k_out, const CouplingShape& shape,
                                  const AffineCouplingParams& params, const AfterCoupling& after, void* stream) {
  launch_forward<false>(type, q, q_strides, k, k_strides, q_out, k_out, shape, params, after, stream);
}

void affine_coupling_inverse_cuda(ElementType type, const void* q, const RowStrides& q_strides, const void* k,
                                  const RowStrides& k_strides, void* q_out, void* k_out, const CouplingShape& shape,
                                  const AffineCouplingParams& params, void* stream) {
  launch_forward<true>(type, q, q_strides, k, k_strides, q_out, k_out, shape, params, AfterCoupling{}, stream);
}

void affine_coupling_backward_cuda(ElementType type, const void* q_out, const void* k_out, const void* grad_q,
                                   const RowStrides& grad_q_strides, const void* grad_k,
                                   const RowStrides& grad_k_strides, void* dq, void* dk, const CouplingShape& s,
                                   const AffineCouplingParams& params, const AffineCouplingGrads& grads,
                                   const AfterCoupling& after, const QKNormGrads& norm_grads, void* stream) {
  validate(s, params, after);
  if (after.norm.q && (!norm_grads.q || !norm_grads.k))
    throw std::invalid_argument("fused coupling: QK-norm needs gradients for the weights of both q and k");
  if (s.batch * s.heads * s.time == 0) return;
  for (int i = 0; i < params.num_steps; ++i)
    if (!grads.w1[i] || !grads.b1[i] || !grads.w2[i] || !grads.b2[i])
      throw std::invalid_argument("fused coupling: missing weight gradients of step " + std::to_string(i));
  const RowStrides dense = RowStrides::contiguous(s);
  require_rows_aligned(q_out, dense, type, "q_out");
  require_rows_aligned(k_out, dense, type, "k_out");
  require_rows_aligned(grad_q, grad_q_strides, type, "grad_q");
  require_rows_aligned(grad_k, grad_k_strides, type, "grad_k");
  require_rows_aligned(dq, dense, type, "dq");
  require_rows_aligned(dk, dense, type, "dk");
  const LaunchPlan plan = plan_launch(s, params.shared_across_heads, /*blocks_per_sm=*/4);
  const int64_t smem = fused_coupling_backward_smem_bytes(s.head_dim, s.hidden, params.num_steps);
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_compiled_shape(s, type, "fused coupling", [&](auto d, auto r, auto tag) {
    constexpr int D = decltype(d)::value, R = decltype(r)::value;
    using T = typename decltype(tag)::type;
    auto kernel = after.norm.q ? coupling_backward_kernel<D, R, T, true> : coupling_backward_kernel<D, R, T, false>;
    allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem, plan.info, kWho, shape_text(s, params.num_steps));
    CQK_LAUNCH(kernel, plan.grid, kThreads, smem, st)(static_cast<const T*>(q_out), static_cast<const T*>(k_out),
                                                      static_cast<const T*>(grad_q), grad_q_strides,
                                                      static_cast<const T*>(grad_k), grad_k_strides,
                                                      static_cast<T*>(dq), static_cast<T*>(dk), plan.work, params,
                                                      grads, after, norm_grads);
  });
  check_cuda(cudaGetLastError(), kWho, "backward launch");
}

}  // namespace cqk::kernels
