#pragma once
// The fused CUDA affine coupling (kernels/coupling_kernels.cu) as a torch
// autograd function. The q/k path (src/ops/qk_path.h) takes it for CUDA
// tensors when cuda_affine_coupling_applies(); the ATen path stays the
// fallback and the reference. See docs/KERNELS.md.
//
// Builds without CUDA (CQK_WITH_CUDA undefined) get the same functions:
// cuda_coupling_built() is false, cuda_affine_coupling_applies() is false and
// the others but fused::affine_weights throw std::logic_error.
#include <ATen/core/Tensor.h>

#include <optional>
#include <utility>
#include <vector>

namespace cqk {

class QKCouplingImpl;
struct CouplingOptions;

// Whether this library was built with the CUDA kernels.
bool cuda_coupling_built();

// Process-wide switch, on by default; CQK_FUSED_COUPLING=0 in the environment
// turns it off at start-up. Off, every coupling takes the ATen path (used to
// compare the two, e.g. by the kernel benchmark).
bool fused_coupling_enabled();
void set_fused_coupling_enabled(bool enabled);

// Whether the q/k path may use the fused kernels for (q, k): the switch is
// on, the kind is affine, q and k are CUDA tensors of one dtype (float32 or
// bfloat16) and shape on one device, the head dim / hidden / steps are compiled
// (cqk::kernels::fused_coupling_supported) and the weights are float32 on that
// device.
bool cuda_affine_coupling_applies(const QKCouplingImpl& coupling, const at::Tensor& q, const at::Tensor& k);

// The coupling of (q, k), differentiable with respect to q, k and the
// coupling's weights. Like the ATen path with recompute_from_inverse, it saves
// only its outputs: the backward kernel rebuilds the inputs with the exact
// inverse. Outputs are contiguous [batch, heads, time, head_dim] in q's dtype
// (math in float32); in bfloat16 the inputs are rebuilt from the rounded
// outputs, which costs bf16-level accuracy in the gradients (tested to 2e-2).
//
// The attention's next steps can run in the same kernel, in its order:
// - qk_norm: RMSNorm of q and of k with these weights (cqk::RMSNormImpl's
//   formula; [head_dim] float32 on q's device, see cuda_qk_norm_applies),
//   differentiable with respect to them too. The kernel then also keeps the
//   coupling's own outputs for the backward (the norm cannot be undone): the
//   activation memory the ATen RMSNorm would keep.
// - rope_base: RoPE (cqk::apply_rope's rotation, positions 0 .. time-1); the
//   backward rotates back what it reads.
struct CudaQKNorm {
  at::Tensor q_weight, k_weight;
  double eps = 1e-5;
};
std::pair<at::Tensor, at::Tensor> cuda_affine_coupling(const QKCouplingImpl& coupling, const at::Tensor& q,
                                                        const at::Tensor& k,
                                                        std::optional<double> rope_base = std::nullopt,
                                                        const std::optional<CudaQKNorm>& qk_norm = std::nullopt);

// Whether cuda_affine_coupling can take these QK-norm weights for q: float32,
// contiguous, [q's head_dim], on q's device.
bool cuda_qk_norm_applies(const at::Tensor& q_weight, const at::Tensor& k_weight, const at::Tensor& q);

// Lower level, no autograd (the GPU tests use these to poison the outputs).
// weights: per step w1, b1, w2, b2 (float32, contiguous, the layout of
// cqk::HeadwiseMLP), 4 * steps tensors. Outputs must be contiguous, of q's
// dtype and shape; weight_grads are float32 like the weights and are ADDED to.
namespace fused {
// What the forward applies after the coupling (kernels::AfterCoupling) and
// the backward takes back; undefined tensors: not applied. The inverse takes none.
struct AfterCoupling {
  at::Tensor rope_cos, rope_sin;            // cqk::rope_tables for q's time and head dim
  at::Tensor q_norm_weight, k_norm_weight;  // [head_dim] float32
  double norm_eps = 1e-5;
  // With QK-norm: the coupling's outputs, written by the forward (contiguous,
  // q's dtype and shape); the backward takes them as its q_out, k_out.
  at::Tensor q_coupled, k_coupled;
  // With QK-norm, for the backward: the norm weights' gradients (float32, ADDED to).
  at::Tensor q_norm_weight_grad, k_norm_weight_grad;
};
void affine_forward_out(const CouplingOptions& options, const std::vector<at::Tensor>& weights, const at::Tensor& q,
                        const at::Tensor& k, const at::Tensor& q_out, const at::Tensor& k_out, bool inverse = false,
                        const AfterCoupling& after = {});
void affine_backward_out(const CouplingOptions& options, const std::vector<at::Tensor>& weights,
                         const at::Tensor& q_out, const at::Tensor& k_out, const at::Tensor& grad_q,
                         const at::Tensor& grad_k, const at::Tensor& dq, const at::Tensor& dk,
                         const std::vector<at::Tensor>& weight_grads, const AfterCoupling& after = {});
// The coupling's weights in the order above.
std::vector<at::Tensor> affine_weights(const QKCouplingImpl& coupling);
}  // namespace fused

}  // namespace cqk
