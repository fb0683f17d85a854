#pragma once
// The affine coupling's options and RoPE tables through an autograd context:
// the fused autograd functions (the CUDA and the CPU coupling) save them in
// the forward and rebuild them in the backward.
// Internal to the library.
#include <torch/csrc/autograd/custom_function.h>

#include <utility>

#include "cqk/coupling.h"

namespace cqk {

inline void save_coupling_options(torch::autograd::AutogradContext* ctx, const CouplingOptions& options) {
  ctx->saved_data["heads"] = options.num_heads();
  ctx->saved_data["head_dim"] = options.head_dim();
  ctx->saved_data["hidden"] = options.hidden();
  ctx->saved_data["steps"] = options.steps();
  ctx->saved_data["clamp"] = options.clamp();
  ctx->saved_data["shared"] = options.shared_across_heads();
}

inline CouplingOptions saved_coupling_options(torch::autograd::AutogradContext* ctx) {
  return CouplingOptions(CouplingKind::Affine, ctx->saved_data["heads"].toInt(), ctx->saved_data["head_dim"].toInt())
      .hidden(ctx->saved_data["hidden"].toInt())
      .steps(ctx->saved_data["steps"].toInt())
      .clamp(ctx->saved_data["clamp"].toDouble())
      .shared_across_heads(ctx->saved_data["shared"].toBool());
}

// RoPE's (cos, sin) tables, or undefined tensors for none.
inline void save_rope_tables(torch::autograd::AutogradContext* ctx, const at::Tensor& cos, const at::Tensor& sin) {
  ctx->saved_data["rope"] = cos.defined();
  if (cos.defined()) ctx->saved_data["rope_cos"] = cos, ctx->saved_data["rope_sin"] = sin;
}

inline std::pair<at::Tensor, at::Tensor> saved_rope_tables(torch::autograd::AutogradContext* ctx) {
  if (!ctx->saved_data["rope"].toBool()) return {};
  return {ctx->saved_data["rope_cos"].toTensor(), ctx->saved_data["rope_sin"].toTensor()};
}

}  // namespace cqk
