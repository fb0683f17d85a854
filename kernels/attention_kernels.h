#pragma once
// Host launchers of the flash-style coupled attention (attention_kernels.cu):
// causal softmax attention whose q and k tiles are coupled (every affine step of
// the coupling, then RoPE when given) as they are loaded, so the coupled q and
// k never reach global memory. Raw pointers only, like fused_coupling.h; the
// torch side is src/ops/fused_attention.cpp.
//
// One launch runs `pairs` (q, k) maps per value head that all read the head's
// one v: pairs = 1 is vanilla attention, pairs = 2 differential attention's
// two maps (A1 v and A2 v in one launch).
//
// Tensors: q and k are [batch, pairs, heads, time, head_dim], v is
// [batch, heads, time, value_dim] (no pair axis), all with any row strides
// (16-byte aligned rows; fused_coupling_rows_aligned); o is [batch, pairs,
// heads, time, value_dim] and lse2, delta and every gradient buffer are
// contiguous in the same layout (dv: v's). The math runs in float32.
#include <cstdint>

#include "coupling_kernels.h"  // AffineCouplingParams, ElementType, CouplingShape, RowStrides

namespace cqk::kernels {

struct AttentionShape {
  int64_t batch = 0, pairs = 1, heads = 0, time = 0;
  int64_t head_dim = 0;   // of q and k (and of the coupling)
  int64_t value_dim = 0;  // of v and o
  int64_t hidden = 0;     // the coupling's
};

// Strides in elements of the batch, pair, head and time dimensions of a
// [batch, pairs, heads, time, dim] tensor (dim has stride 1).
struct PairedRowStrides {
  int64_t batch = 0, pair = 0, head = 0, time = 0;
};

// The inputs both passes read.
struct CoupledAttentionInputs {
  const void* q = nullptr;
  PairedRowStrides q_strides;
  const void* k = nullptr;
  PairedRowStrides k_strides;
  const void* v = nullptr;
  RowStrides v_strides;
  AttentionShape shape;
  AffineCouplingParams coupling;
  // One coupling per (pair, head) instead of one per head shared by the
  // pairs: flash_math.cuh's coupling_weight_group says which weights a pair uses.
  bool separate_pair_couplings = false;
  RopeTables rope;
  float softmax_scale = 0.0f;  // usually 1 / sqrt(head_dim)
};

// Shapes the kernels are compiled for: head_dim 64/128 with value_dim equal
// to it or twice it (differential attention), hidden 8/16, 1..kMaxSteps steps.
bool coupled_attention_shape_supported(int64_t head_dim, int64_t value_dim, int64_t hidden, int64_t steps);
// Shared memory (bytes) of the larger of the two kernels.
int64_t coupled_attention_smem_bytes(int64_t head_dim, int64_t value_dim, int64_t hidden, int64_t steps);
// The shape is compiled and the current device has the shared memory. False without a device.
// (The autograd function's backward also runs the coupling's backward kernel:
// fused_coupling_supported must hold too.)
bool coupled_attention_supported(int64_t head_dim, int64_t value_dim, int64_t hidden, int64_t steps);

// For each pair: o = softmax(causal(q'' k''^T * scale)) v with
// (q', k') = coupling(q, k) and q'' = RoPE(q'), k'' = RoPE(k'). o: contiguous,
// q's element type. lse2: [batch, pairs, heads, time] float32, log2 of each
// row's sum of exp2 of the log2-domain scores (flash_math.cuh), for the backward.
void coupled_attention_forward_cuda(ElementType type, const CoupledAttentionInputs& in, void* o, float* lse2,
                                    void* stream);

// The backward of the attention from the inputs and lse2, recomputing the
// coupled tiles. grad_o may be strided (16-byte aligned rows). Writes
// delta[batch, pairs, heads, time] (scratch: rowsum(grad_o * o)), dk_coupled
// and dv (the sum over the pairs), and ADDS to dq_coupled (atomically: zero it
// first). dq_coupled and dk_coupled are float32 gradients with respect to the
// coupling's outputs (q', k'), RoPE already transposed; dv has q's element
// type. The coupling's own backward is fused_coupling.h's affine_coupling_backward_cuda.
void coupled_attention_backward_cuda(ElementType type, const CoupledAttentionInputs& in, const void* o,
                                     const void* grad_o, const PairedRowStrides& grad_o_strides, const float* lse2,
                                     float* delta, float* dq_coupled, float* dk_coupled, void* dv, void* stream);

}  // namespace cqk::kernels
