#pragma once
// The affine coupling on the CPU in one pass per token, with raw pointers and
// no torch headers: these units are compiled for AVX2 and AVX-512 with OpenMP
// (see src/simd/CMakeLists.txt), so torch's inline code must never be compiled
// here. The arguments are those of the CUDA launchers (kernels/coupling_kernels.h:
// CouplingShape, AffineCouplingParams, AffineCouplingGrads, RowStrides), which
// src/ops/kernel_arguments.h makes from tensors. The math is that of
// kernels/coupling_math.cuh and QKCoupling::transform:
//   step i (even: k from q, odd: q from k), x the conditioning vector, y the updated one,
//   a = W1 x + b1, h = silu(a), s = c tanh((W2s h + b2s) / c), t = W2t h + b2t, y <- y exp(s) + t.
// The backward walks the steps in reverse, rebuilding each step's input with
// the exact inverse y <- (y - t) exp(-s) from the same conditioner evaluation
// that its gradient needs, so nothing but the outputs is kept.
#include "coupling_kernels.h"  // kernels/

namespace cqk::cpu {

// Whether this machine runs a compiled copy (AVX2 and FMA at least) and the
// shape and step count are covered: head dim a multiple of 8 up to 256,
// hidden 8 or 16, 1 to AffineCouplingParams::kMaxSteps steps, clamp in (0, 80].
bool affine_coupling_supported(const kernels::CouplingShape& shape, int64_t steps, float clamp);

// q, k: [batch, heads, time, D] float32 with their row strides; q_out, k_out:
// the same, contiguous, rotated by RoPE after the coupling when `rope` has tables (the
// CUDA kernels' [time, D/2] tables, positions 0 .. time-1). Uses the OpenMP
// threads torch is set to (the same runtime; see docs/ARCHITECTURE.md).
void affine_coupling_forward(const kernels::CouplingShape& shape, const kernels::AffineCouplingParams& params,
                             const float* q, const kernels::RowStrides& q_strides, const float* k,
                             const kernels::RowStrides& k_strides, float* q_out, float* k_out,
                             const kernels::RopeTables& rope = {});

// From the outputs and their gradients (all contiguous): the inputs' gradients
// (written, contiguous) and the weights' gradients (ADDED to). With the
// forward's `rope`, outputs and gradients are rotated back first.
void affine_coupling_backward(const kernels::CouplingShape& shape, const kernels::AffineCouplingParams& params,
                              const float* q_out, const float* k_out, const float* grad_q_out,
                              const float* grad_k_out, float* grad_q, float* grad_k,
                              const kernels::AffineCouplingGrads& grads, const kernels::RopeTables& rope = {});

}  // namespace cqk::cpu
