#pragma once
// The affine coupling's CPU kernel (src/simd/affine_coupling_cpu.cpp) as a
// torch autograd function. The q/k path (src/ops/qk_path.h) takes it for float32
// CPU tensors when cpu_affine_coupling_applies(); the ATen path stays the
// fallback and the reference (CQK_FUSED_COUPLING=0 forces it). Internal to the library.
#include <ATen/core/Tensor.h>

#include <optional>
#include <utility>

namespace cqk {

class QKCouplingImpl;

// The switch is on, the kind is affine with recompute_from_inverse, q and k are
// float32 CPU tensors of one shape with contiguous channels, the weights are
// float32 on the CPU, and the machine and shape are compiled (AVX2 and FMA;
// head dim a multiple of 8 up to 256; hidden 8 or 16).
bool cpu_affine_coupling_applies(const QKCouplingImpl& coupling, const at::Tensor& q, const at::Tensor& k);

// The coupling of (q, k), differentiable with respect to q, k and the
// coupling's weights; like ops::recompute_from_inverse it keeps only its outputs.
// Outputs are contiguous [batch, heads, time, head_dim]; with rope_base they
// are also rotated by RoPE (apply_rope's rotation, positions 0 .. time-1),
// in the same pass, and the backward rotates back what it reads.
std::pair<at::Tensor, at::Tensor> cpu_affine_coupling(const QKCouplingImpl& coupling, const at::Tensor& q,
                                                      const at::Tensor& k,
                                                      std::optional<double> rope_base = std::nullopt);

}  // namespace cqk
