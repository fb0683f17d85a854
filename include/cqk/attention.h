#pragma once
// Causal self-attention with the coupling between the projections and the
// scoring, for four scoring mechanisms. Data flow per mechanism:
//   projections -> coupling -> [QK-norm] -> RoPE -> scores -> [MTA conv, mixing] -> softmax -> values
// (docs/ARCHITECTURE.md has the table).
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cqk/coupling.h"
#include "cqk/rms_norm.h"

namespace cqk {

namespace ops {  // src/ops/qk_path.h (internal to the library)
struct BeforeScoring;
struct Scoring;
}  // namespace ops

enum class AttentionKind {
  Vanilla,       // softmax(q k^T / sqrt(d)) v, fused SDPA
  Differential,  // (softmax(q1 k1^T) - lambda softmax(q2 k2^T)) v, arXiv 2410.05258
  QKNorm,        // per-head RMSNorm of q and k before scoring
  MultiToken,    // key-query convolution over the logits + head mixing, arXiv 2504.00927
};

// Differential attention's lambda vectors start as N(0, this^2) per component.
constexpr double kDifferentialLambdaInitStd = 0.1;

// The kinds' config names, in enum order: what model.attention.kind accepts.
const std::vector<std::string>& attention_kind_names();
AttentionKind parse_attention_kind(const std::string& name);  // throws std::invalid_argument
std::string to_string(AttentionKind kind);

struct MultiTokenOptions {
  TORCH_ARG(int64_t, query_kernel) = 6;  // c_q, causal over queries
  TORCH_ARG(int64_t, key_kernel) = 11;   // c_k, odd, centred on the key
  TORCH_ARG(int64_t, head_group) = 2;    // heads mixed within groups of this size
};

struct AttentionOptions {
  AttentionOptions() = default;
  AttentionOptions(int64_t width, int64_t num_heads) : width_(width), num_heads_(num_heads) {}

  TORCH_ARG(AttentionKind, kind) = AttentionKind::Vanilla;
  TORCH_ARG(int64_t, width) = 128;
  // Query heads of size width / num_heads. Differential pairs them: num_heads/2
  // heads, each with two (q, k) pairs and a value of twice the head size.
  TORCH_ARG(int64_t, num_heads) = 4;
  // Key/value heads (grouped-query attention); 0 means num_heads.
  TORCH_ARG(int64_t, num_kv_heads) = 0;
  TORCH_ARG(int64_t, layer_index) = 0;   // sets Differential's lambda_init
  TORCH_ARG(bool, rope) = true;
  TORCH_ARG(double, rope_base) = 10000.0;
  TORCH_ARG(bool, causal) = true;
  TORCH_ARG(double, norm_eps) = 1e-5;
  TORCH_ARG(MultiTokenOptions, mta) = {};
  // The coupling; its num_heads and head_dim are set by the attention.
  TORCH_ARG(CouplingOptions, coupling) = {};
  // Differential: one coupling per (q, k) pair instead of one shared by both.
  TORCH_ARG(bool, separate_pair_couplings) = false;
};

// The shapes that attention options imply, and the rules they must keep: one
// home for the module, the parameter count and the config check.
struct AttentionShape {
  int64_t head_dim = 0;        // width / num_heads
  int64_t kv_heads = 0;        // num_kv_heads, or num_heads for 0
  int64_t coupling_heads = 0;  // heads of the coupling: Differential's pairs share one unless separate
};
// A broken rule: the config key it concerns and what is wrong ("must divide model.width (128), got 3").
struct ShapeProblem {
  std::string key;
  std::string what;
};
// The first rule `options` break, or nullopt.
std::optional<ShapeProblem> attention_shape_problem(const AttentionOptions& options);
// The shapes of valid options; throws std::invalid_argument "attention: KEY: WHAT" otherwise.
AttentionShape attention_shape(const AttentionOptions& options);

// Differential attention's lambda_init for a layer: 0.8 - 0.6 exp(-0.3 l).
double differential_lambda_init(int64_t layer_index);

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const AttentionOptions& options);

  // x: [batch, time, width] -> [batch, time, width].
  at::Tensor forward(const at::Tensor& x);

  // The attention logits of the MultiToken mechanism after its convolution,
  // before softmax, with masked entries at -inf: [batch, heads, time, time].
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

}  // namespace cqk
