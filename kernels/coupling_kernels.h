#pragma once
// Host launchers for the fused affine-coupling kernels (coupling_kernels.cu).
// Raw pointers only, so that neither side of the boundary needs the other's
// headers: the torch side is src/ops/cuda_coupling.cpp.
//
// Tensors: q and k are [batch, heads, time, head_dim] with the last dimension
// contiguous and any strides (in elements) for the other three, as long as every
// row starts on a 16-byte boundary (data pointer and strides multiples of 16
// bytes). Every output is written contiguous, [batch, heads, time, head_dim].
// Element type: float32 or bfloat16 for q, k and their gradients (the math runs
// in float32); the weights and their gradients are always float32.
#include <cstdint>

namespace cqk::kernels {

// Weights of an affine coupling: per step, the tensors of cqk::HeadwiseMLP
// ([groups, R, D], [groups, R], [groups, 2D, R], [groups, 2D]), contiguous
// float32 on the device; groups = heads, or 1 when shared across heads.
struct AffineCouplingParams {
  static constexpr int kMaxSteps = 8;
  const float* w1[kMaxSteps];
  const float* b1[kMaxSteps];
  const float* w2[kMaxSteps];
  const float* b2[kMaxSteps];
  int num_steps = 0;
  bool shared_across_heads = false;
  float clamp = 2.0f;
};

// Float32 gradient buffers shaped like the weights. The backward ADDS to them
// (atomically), so zero them first.
struct AffineCouplingGrads {
  float* w1[AffineCouplingParams::kMaxSteps];
  float* b1[AffineCouplingParams::kMaxSteps];
  float* w2[AffineCouplingParams::kMaxSteps];
  float* b2[AffineCouplingParams::kMaxSteps];
};

enum class ElementType { Float32, BFloat16 };

// RoPE (rotate-half) tables: cos and sin of position t times frequency i, as
// [time, head_dim / 2] contiguous float32 on the device. Null: no RoPE.
struct RopeTables {
  const float* cos = nullptr;
  const float* sin = nullptr;
};

// QK-norm (qk_norm_math.cuh): RMSNorm of q and of k over head_dim, weights
// [head_dim] float32 on the device. Null weights: no QK-norm.
struct QKNormWeights {
  const float* q = nullptr;
  const float* k = nullptr;
  float eps = 1e-5f;
};

// The QK-norm weights' gradients, [head_dim] float32, ADDED to by the backward.
struct QKNormGrads {
  float* q = nullptr;
  float* k = nullptr;
};

// What the forward kernel applies to the coupling's outputs before it writes
// them, in this order (the attention's placement: coupling -> QK-norm -> RoPE),
// and what the backward then takes back.
struct AfterCoupling {
  QKNormWeights norm;
  RopeTables rope;
  // With QK-norm, the forward also writes the coupling's own outputs here
  // (contiguous, q's dtype) and the backward rebuilds the inputs from them:
  // the norm's scale cannot be undone. Null: not kept (no backward to come).
  void* q_coupled = nullptr;
  void* k_coupled = nullptr;
};

struct CouplingShape {
  int64_t batch = 0, heads = 0, time = 0, head_dim = 0, hidden = 0;
};

// Strides in elements of the batch, head and time dimensions (head_dim has stride 1).
struct RowStrides {
  int64_t batch = 0, head = 0, time = 0;
  static RowStrides contiguous(const CouplingShape& s) {
    return {s.heads * s.time * s.head_dim, s.time * s.head_dim, s.head_dim};
  }
};

// Head dim and hidden width the kernels are compiled for (64/128 and 8/16),
// 1..kMaxSteps steps. Host only, no device needed.
bool fused_coupling_shape_supported(int64_t head_dim, int64_t hidden, int64_t steps);
// Shared memory (bytes) one block of the backward kernel needs, the largest of the kernels.
int64_t fused_coupling_backward_smem_bytes(int64_t head_dim, int64_t hidden, int64_t steps);
// The shape is supported and the current CUDA device has the shared memory the
// backward kernel needs. False when there is no device.
bool fused_coupling_supported(int64_t head_dim, int64_t hidden, int64_t steps);

// Row alignment the kernels need for an input with this data pointer and these strides.
bool fused_coupling_rows_aligned(const void* data, const RowStrides& strides, ElementType type);

// q_out, k_out = the coupling of (q, k), then what `after` asks for (RoPE for
// positions 0 .. time-1). Throws std::invalid_argument for an unsupported
// shape or misaligned rows, std::runtime_error for a CUDA error.
void affine_coupling_forward_cuda(ElementType type, const void* q, const RowStrides& q_strides, const void* k,
                                  const RowStrides& k_strides, void* q_out, void* k_out, const CouplingShape& shape,
                                  const AffineCouplingParams& params, const AfterCoupling& after, void* stream);
// q_out, k_out = the exact inverse of the coupling at (q, k).
void affine_coupling_inverse_cuda(ElementType type, const void* q, const RowStrides& q_strides, const void* k,
                                  const RowStrides& k_strides, void* q_out, void* k_out, const CouplingShape& shape,
                                  const AffineCouplingParams& params, void* stream);
// The backward in one pass that saves nothing from the forward but its outputs:
// per token, rebuilds (q, k) from the contiguous outputs (q_out, k_out) with the
// exact inverse, step by step, and backpropagates (grad_q, grad_k) through each
// step. Writes dq, dk (contiguous) and adds the weight gradients to `grads`.
// With `after` (the forward's): grad_q, grad_k are the gradients of the
// forward's q_out, k_out; q_out, k_out are those outputs, or with QK-norm the
// forward's q_coupled, k_coupled (after.q_coupled is not read here). RoPE and
// QK-norm are taken back first; the norm's weight gradients go to norm_grads.
void affine_coupling_backward_cuda(ElementType type, const void* q_out, const void* k_out, const void* grad_q,
                                   const RowStrides& grad_q_strides, const void* grad_k,
                                   const RowStrides& grad_k_strides, void* dq, void* dk, const CouplingShape& shape,
                                   const AffineCouplingParams& params, const AffineCouplingGrads& grads,
                                   const AfterCoupling& after, const QKNormGrads& norm_grads, void* stream);

}  // namespace cqk::kernels
