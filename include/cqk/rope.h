#pragma once
// Rotary position embedding (rotate-half form) over the last dimension.
#include <ATen/core/Tensor.h>

#include <utility>

namespace cqk {

// x: [batch, heads, time, head_dim] with an even head_dim; position t of the
// time axis is rotated by angles t * base^(-2i/head_dim), i < head_dim/2.
// Float32 CPU tensors (x86-64 with AVX2), and float32 or bf16 CUDA tensors,
// are rotated by a one-pass kernel each way (src/simd/rope_cpu.h,
// kernels/rope_kernels.h), read in place when the last dimension is
// contiguous; elsewhere, and with CQK_FUSED_ROPE=0 or
// set_fused_rope_enabled(false), by the ATen ops.
at::Tensor apply_rope(const at::Tensor& x, double base, int64_t position_offset = 0);

bool fused_rope_enabled();
void set_fused_rope_enabled(bool enabled);

// The rotation angles t * base^(-2i/head_dim) in float64, [time, head_dim / 2],
// for positions position_offset .. position_offset + time - 1 (float64: positions
// times frequencies lose digits in float32 at long lengths). apply_rope and the
// fused attention kernels' tables both come from here.
at::Tensor rope_angles(int64_t time, int64_t head_dim, double base, int64_t position_offset, const at::Device& device);

// cos and sin of rope_angles as [time, head_dim / 2] contiguous float32: the
// tables the kernels that apply RoPE read. Kept per (shape, base, offset,
// device) and shared: read them, never write them.
std::pair<at::Tensor, at::Tensor> rope_tables(int64_t time, int64_t head_dim, double base, const at::Device& device,
                                              int64_t position_offset = 0);

}  // namespace cqk
