#pragma once
// The flash-style coupled attention (kernels/attention_kernels.cu) as a torch
// autograd function: causal softmax attention whose q and k tiles are coupled,
// and rotated by RoPE, as the kernel loads them, so the coupled q and k never
// reach global memory. Its backward recomputes the coupled tiles from the
// inputs and then runs the fused coupling's backward.
//
// Off by default: it has not yet been measured against the default GPU path
// (fused coupling kernel + PyTorch SDPA) on a GPU. CQK_FUSED_ATTENTION=1 in the
// environment or set_fused_attention_enabled(true) turns it on; then
// the q/k path (src/ops/qk_path.h) takes it for causal softmax attention with
// an affine coupling whenever fused_coupled_attention_applies() (vanilla) or
// fused_paired_coupled_attention_applies() (differential). docs/KERNELS.md.
//
// Builds without CUDA: fused_attention_built() is false, the applies() are
// false and the attention functions throw std::logic_error.
#include <ATen/core/Tensor.h>

#include <optional>

namespace cqk {

class QKCouplingImpl;

bool fused_attention_built();
bool fused_attention_enabled();
void set_fused_attention_enabled(bool enabled);

// Whether fused_coupled_attention(coupling, q, k, v, ...) may run: the switch is
// on, the coupling is affine with float32 weights on q's device, q, k and v are
// CUDA tensors [batch, heads, time, head_dim] of one shape and dtype (float32 or
// bfloat16), and the kernels are compiled for the head dim, hidden width and
// steps and fit the device's shared memory.
bool fused_coupled_attention_applies(const QKCouplingImpl& coupling, const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& v);

// softmax(causal(q'' k''^T / sqrt(head_dim))) v, where (q', k') = coupling(q, k)
// and (q'', k'') = RoPE(q', k') with `rope_base` (no RoPE when nullopt), as
// apply_rope computes it. Differentiable with respect to q, k, v and the
// coupling's weights. Output: contiguous [batch, heads, time, head_dim] in q's dtype.
at::Tensor fused_coupled_attention(const QKCouplingImpl& coupling, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, std::optional<double> rope_base);

// Several (q, k) pairs per value head in one launch: q and k are
// [batch, pairs, heads, time, head_dim] (any strides), v is
// [batch, heads, time, value_dim], shared by the pairs. Differential attention
// is pairs = 2 with value_dim = 2 * head_dim: the result holds A1 v and A2 v.
// The coupling has either `heads` heads, each shared by the pairs (the
// differential module's default, which folds the pairs into the batch), or
// pairs * heads, pair-major (its separate_pair_couplings). Same conditions as
// fused_coupled_attention_applies otherwise; the compiled (head_dim,
// value_dim) pairs are kernels::coupled_attention_shape_supported's.
bool fused_paired_coupled_attention_applies(const QKCouplingImpl& coupling, const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v);

// For each pair p: softmax(causal(q''_p k''_p^T / sqrt(head_dim))) v, as
// fused_coupled_attention. Output: contiguous [batch, pairs, heads, time,
// value_dim] in q's dtype; differentiable with respect to q, k, v (its
// gradient summed over the pairs) and the coupling's weights.
at::Tensor fused_paired_coupled_attention(const QKCouplingImpl& coupling, const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, std::optional<double> rope_base);

}  // namespace cqk
