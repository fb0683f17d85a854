#pragma once
// Whether a trained model uses its coupling at all: per layer, how far the
// map moves q and k away from the projections, and how much it scales them.
// `cqk train` logs these at every evaluation (metrics.jsonl, results.json) and
// `cqk inspect RUN_DIR` shows them.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "cqk/model.h"

namespace cqk {

struct CouplingDiagnostics {
  int64_t layer = 0;
  // ||q' - q|| / ||q|| over the batch (and likewise for k): 0 is the identity.
  double q_change = 0.0;
  double k_change = 0.0;
  // Affine: mean |s| of the clamped log-scales, over steps, heads, tokens and dims.
  std::optional<double> mean_abs_log_scale;
  // log |det J| of the map per token and coupling head, averaged; the sum of a
  // token's log-scales for Affine, 0 for symplectic Dynamics (volume
  // preserving). Not known cheaply for the non-invertible controls.
  std::optional<double> mean_log_det;
};

// The diagnostics of one coupling on its inputs (q, k as the coupling sees
// them), computed in float32 without autograd.
CouplingDiagnostics coupling_diagnostics(const QKCouplingImpl& coupling, const at::Tensor& q, const at::Tensor& k);

// The layers' mean of each diagnostic (a metric no layer has stays left out).
CouplingDiagnostics mean_over_layers(const std::vector<CouplingDiagnostics>& layers);

// One entry per layer of `model` on the batch `tokens` ([batch, time] int64,
// on the model's device); empty when the model has no coupling.
std::vector<CouplingDiagnostics> coupling_diagnostics(TransformerLM& model, const at::Tensor& tokens);

}  // namespace cqk
