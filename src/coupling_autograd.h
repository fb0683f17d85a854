#pragma once
// The affine coupling's options through an autograd context: the fused
// autograd functions (the CUDA coupling and the CUDA flash attention) save
// them in the forward and rebuild them in the backward. Internal to the library.
#include <torch/csrc/autograd/custom_function.h>

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

}  // namespace cqk
