#pragma once
// Causal self-attention with the coupling between the projections and the
// scoring, for four scoring mechanisms. Data flow per mechanism:
//   projections -> coupling -> [QK-norm] -> RoPE -> scores -> [MTA conv, mixing] -> softmax -> values
// (docs/ARCHITECTURE.md has the table).
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <utility>
#include <vector>

#include "cqk/attention_options.h"
#include "cqk/coupling.h"
#include "cqk/rms_norm.h"

namespace cqk {

namespace ops {  // src/ops/qk_path.h (internal to the library)
struct BeforeScoring;
struct Scoring;
}  // namespace ops

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const AttentionOptions& options);

  // x: [batch, time, width] -> [batch, time, width].
  at::Tensor forward(const at::Tensor& x);

  // The attention logits of the MultiToken mechanism after its convolution,
  // before softmax, with masked entries at -inf: [batch, heads, time, time].
  // Throws std::logic_error for an attention of another kind.
  at::Tensor multi_token_logits(const at::Tensor& q, const at::Tensor& k) const;

  // q and k of x as the coupling sees them, [batch', coupling heads, time,
  // head_dim]: shared keys expanded to every query head; Differential's pairs
  // folded into the batch (one coupling for both) or into the heads (separate).
  std::pair<at::Tensor, at::Tensor> coupling_inputs(const at::Tensor& x);

  const AttentionOptions& options() const { return options_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t coupling_parameter_count() const { return coupling_->parameter_count(); }
  // Parameters that start at the identity (MTA's kernel and mixing): weight
  // decay would pull them toward zero, so the optimizer treats them as it
  // treats norms and biases, never as weight matrices.
  std::vector<at::Tensor> identity_initialised_parameters() const;

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};
  QKCoupling coupling_{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // QKNorm
  RMSNorm head_norm{nullptr};                // Differential and MultiToken: per-head output norm
  at::Tensor lambda_q1, lambda_k1, lambda_q2, lambda_k2;  // Differential
  at::Tensor mta_kernel;                     // MultiToken: [heads, 1, c_q, c_k]
  at::Tensor mta_mixing;                     // MultiToken: [heads / group, group, group]

 private:
  at::Tensor forward_differential(const at::Tensor& q, const at::Tensor& k, const at::Tensor& x);
  at::Tensor score(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const;
  // What ops:: (src/ops/qk_path.h) applies between the coupling and the scores, and how it scores.
  ops::BeforeScoring before_scoring() const;
  ops::Scoring scoring() const;
  // Grouped-query attention: [B, kv heads, T, d] -> [B, heads, T, d].
  at::Tensor expand_kv_heads(const at::Tensor& t) const;
  // Differential: [B, H, T, d] -> [B, 2, H/2, T, d], heads 2i and 2i+1 being
  // the two (q, k) pairs of differential head i.
  at::Tensor by_pair(const at::Tensor& t) const;
  // Differential: the coupling's view of by_pair's layout (see coupling_inputs).
  std::vector<int64_t> pair_coupling_shape(int64_t batch, int64_t time) const;

  AttentionOptions options_;
  int64_t head_dim_;
  int64_t kv_heads_;
  double lambda_init_ = 0.0;
};
TORCH_MODULE(Attention);

// The parameters an Attention of `options` has, counted without making it:
// its own (projections, norms, lambdas, MTA's kernel and mixing) and its coupling's.
struct AttentionParameterCount {
  int64_t attention = 0;
  int64_t coupling = 0;
};
AttentionParameterCount attention_parameter_count(const AttentionOptions& options);

}  // namespace cqk
