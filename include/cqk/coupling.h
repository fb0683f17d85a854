#pragma once
// The coupled query-key map: a small per-head map that evolves each token's
// (q, k) jointly between the projections and the scoring. See
// docs/METHOD.md for the math and docs/ARCHITECTURE.md for the data flow.
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <utility>
#include <vector>

#include "cqk/coupling_options.h"
#include "cqk/headwise_mlp.h"

namespace cqk {

bool is_invertible(const CouplingOptions& options);
// Hidden width of the kind's MLPs: `hidden` for Affine, matched to Affine's
// parameter count for the controls.
int64_t coupling_hidden_width(const CouplingOptions& options);
// Parameters of a coupling with these options (the formula of docs/METHOD.md).
int64_t coupling_parameter_count(const CouplingOptions& options);

class QKCouplingImpl : public torch::nn::Module {
 public:
  explicit QKCouplingImpl(const CouplingOptions& options);

  // q, k: [batch, heads, time, head_dim]. Returns the coupled (q', k'), by the
  // fastest path that covers the inputs (src/ops/qk_path.h).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& q, const at::Tensor& k);
  // The exact inverse: inverse(forward(q, k)) == (q, k). Throws for the
  // non-invertible kinds (NonInvertible, Uncoupled, Dynamics with Euler).
  std::pair<at::Tensor, at::Tensor> inverse(const at::Tensor& q, const at::Tensor& k);

  const CouplingOptions& options() const { return options_; }
  int64_t parameter_count() const;

  // The map itself in ATen, differentiable with plain autograd: the reference
  // every accelerated path is tested against, and the last resort of forward. Affine: `log_scales`, when given, receives each
  // step's clamped log-scale s (coupling_diagnostics.h).
  std::pair<at::Tensor, at::Tensor> transform(at::Tensor q, at::Tensor k,
                                              std::vector<at::Tensor>* log_scales = nullptr) const;
  std::pair<at::Tensor, at::Tensor> inverse_transform(at::Tensor q, at::Tensor k) const;

 private:
  void check_input(const at::Tensor& q, const at::Tensor& k, const char* where) const;

  CouplingOptions options_;
  std::vector<HeadwiseMLP> conditioners_;  // Affine: one per step; NonInvertible: one; Uncoupled: f, g; Dynamics: f
  at::Tensor dt_;                          // Dynamics: [groups]
};
TORCH_MODULE(QKCoupling);

}  // namespace cqk
