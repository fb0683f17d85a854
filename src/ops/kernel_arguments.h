#pragma once
// Tensors to the raw-pointer arguments of the coupling kernels: the CUDA
// launchers in kernels/ and the CPU kernel in src/simd/, which take the same
// argument types (kernels/coupling_kernels.h): element types, row strides,
// readable copies, coupling weights and their gradients, RoPE tables, the
// stream. Internal to src/ops/ (the coupling and RoPE kernels' glue);
// kernel_readable and current_stream are in CUDA builds only.
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "cqk/coupling.h"
#include "coupling_kernels.h"  // kernels/: AffineCouplingParams, ElementType, RowStrides, CouplingShape

namespace cqk::kernel_arguments {

// float32 or bfloat16; anything else throws std::invalid_argument "<who>: dtype ...".
kernels::ElementType element_type(const at::Tensor& t, const std::string& who);

// Strides of the batch, head and time dimensions of a [batch, heads, time, dim]
// tensor; dimensions of size 1 get 0 (never multiplied by anything but 0).
kernels::RowStrides row_strides(const at::Tensor& t);

#ifdef CQK_WITH_CUDA
// t itself when the kernels can read it in place (last dimension contiguous,
// rows on 16-byte boundaries; any rank), else a contiguous copy.
at::Tensor kernel_readable(const at::Tensor& t, const std::string& who);
#endif

kernels::CouplingShape shape_of(const CouplingOptions& options, const at::Tensor& q);

// Checks the weights (per step w1, b1, w2, b2: contiguous float32 on `device`,
// shaped as the options say) and collects their pointers; std::invalid_argument
// "<who>: ..." otherwise.
kernels::AffineCouplingParams coupling_params(const CouplingOptions& options, const std::vector<at::Tensor>& weights,
                                              const at::Device& device, const std::string& who);

// Checks the weight gradients (contiguous float32 on `device`, shaped like
// `weights`) and collects their pointers; std::invalid_argument "<who>: ..." otherwise.
kernels::AffineCouplingGrads coupling_grads(const std::vector<at::Tensor>& weights,
                                            const std::vector<at::Tensor>& weight_grads, const at::Device& device,
                                            const std::string& who);

// RoPE tables (cos, sin: [time, head_dim / 2] contiguous float32 on `device`,
// as cqk::rope_tables makes them) as the kernels take them; undefined tensors
// mean no RoPE. std::invalid_argument "<who>: ..." otherwise.
kernels::RopeTables rope_tables(const at::Tensor& cos, const at::Tensor& sin, int64_t time, int64_t head_dim,
                                const at::Device& device, const std::string& who);

// A [dim] contiguous float32 vector on `device`: a per-channel weight (QK-norm's)
// as the kernels read it.
bool is_channel_vector(const at::Tensor& t, int64_t dim, const at::Device& device);

#ifdef CQK_WITH_CUDA
// The current CUDA stream of t's device, as the launchers take it.
void* current_stream(const at::Tensor& t);
#endif

}  // namespace cqk::kernel_arguments
