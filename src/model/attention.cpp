#include "cqk/attention.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

#include "ops/qk_path.h"

namespace cqk {

namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("attention: " + message);
}

// [batch, time, heads * dim] -> [batch, heads, time, dim]
at::Tensor split_heads(const at::Tensor& x, int64_t heads) {
  return x.view({x.size(0), x.size(1), heads, -1}).transpose(1, 2);
}

// [batch, heads, time, dim] -> [batch, time, heads * dim]
at::Tensor merge_heads(const at::Tensor& x) {
  return x.transpose(1, 2).reshape({x.size(0), x.size(2), -1});
}

}  // namespace

AttentionImpl::AttentionImpl(const AttentionOptions& options) : options_(options) {
  const auto shape = attention_shape(options);
  const int64_t width = options.width(), heads = options.num_heads();
  head_dim_ = shape.head_dim;
  kv_heads_ = shape.kv_heads;

  q_proj = register_module("q_proj", torch::nn::Linear(torch::nn::LinearOptions(width, width).bias(false)));
  k_proj = register_module("k_proj",
                           torch::nn::Linear(torch::nn::LinearOptions(width, kv_heads_ * head_dim_).bias(false)));
  v_proj = register_module("v_proj",
                           torch::nn::Linear(torch::nn::LinearOptions(width, kv_heads_ * head_dim_).bias(false)));
  out_proj = register_module("out_proj", torch::nn::Linear(torch::nn::LinearOptions(width, width).bias(false)));

  auto coupling_options = options.coupling();
  coupling_options.num_heads(shape.coupling_heads).head_dim(head_dim_);
  coupling_ = register_module("coupling", QKCoupling(coupling_options));

  switch (options.kind()) {
    case AttentionKind::Vanilla: break;
    case AttentionKind::QKNorm:
      q_norm = register_module("q_norm", RMSNorm(head_dim_, options.norm_eps()));
      k_norm = register_module("k_norm", RMSNorm(head_dim_, options.norm_eps()));
      break;
    case AttentionKind::Differential:
      lambda_init_ = differential_lambda_init(options.layer_index());
      lambda_q1 = register_parameter("lambda_q1", at::randn({head_dim_}) * kDifferentialLambdaInitStd);
      lambda_k1 = register_parameter("lambda_k1", at::randn({head_dim_}) * kDifferentialLambdaInitStd);
      lambda_q2 = register_parameter("lambda_q2", at::randn({head_dim_}) * kDifferentialLambdaInitStd);
      lambda_k2 = register_parameter("lambda_k2", at::randn({head_dim_}) * kDifferentialLambdaInitStd);
      head_norm = register_module("head_norm", RMSNorm(2 * head_dim_, options.norm_eps()));
      break;
    case AttentionKind::MultiToken: {
      const auto& mta = options.mta();
      // Identity initialisation: a delta at the current query and key, no head mixing.
      auto kernel = at::zeros({heads, 1, mta.query_kernel(), mta.key_kernel()});
      kernel.select(2, mta.query_kernel() - 1).select(2, mta.key_kernel() / 2).fill_(1.0);
      mta_kernel = register_parameter("mta_kernel", kernel);
      mta_mixing = register_parameter(
          "mta_mixing", at::eye(mta.head_group()).repeat({heads / mta.head_group(), 1, 1}));
      head_norm = register_module("head_norm", RMSNorm(head_dim_, options.norm_eps()));
      break;
    }
  }
  if (head_norm) {
    at::NoGradGuard no_grad;
    head_norm->weight.fill_(options.head_norm_init());
  }
}

// From the options alone, beside the constructor it mirrors: a new kind's
// parameters are counted where they are made.
AttentionParameterCount attention_parameter_count(const AttentionOptions& options) {
  const auto shape = attention_shape(options);
  const int64_t width = options.width(), heads = options.num_heads(), head_dim = shape.head_dim,
                kv_heads = shape.kv_heads;
  AttentionParameterCount count;
  // q and out: width x width; k and v: width x (kv_heads * head_dim); no biases.
  count.attention = 2 * width * width + 2 * width * kv_heads * head_dim;
  switch (options.kind()) {
    case AttentionKind::Vanilla: break;
    case AttentionKind::QKNorm: count.attention += 2 * head_dim; break;  // q_norm, k_norm
    case AttentionKind::Differential:
      count.attention += 4 * head_dim + 2 * head_dim;  // lambda_{q1,k1,q2,k2}, head_norm over 2 * head_dim
      break;
    case AttentionKind::MultiToken: {
      const auto& mta = options.mta();
      count.attention += heads * mta.query_kernel() * mta.key_kernel()                // kernel [heads, 1, c_q, c_k]
                         + (heads / mta.head_group()) * mta.head_group() * mta.head_group()  // mixing
                         + head_dim;                                                  // head_norm
      break;
    }
  }
  auto coupling = options.coupling();
  coupling.num_heads(shape.coupling_heads).head_dim(head_dim);
  count.coupling = coupling_parameter_count(coupling);
  return count;
}

at::Tensor AttentionImpl::expand_kv_heads(const at::Tensor& t) const {
  // The coupling pairs each query head with a key head, so shared keys are expanded first.
  const int64_t repeat = options_.num_heads() / kv_heads_;
  return repeat == 1 ? t : t.repeat_interleave(repeat, 1);
}

at::Tensor AttentionImpl::by_pair(const at::Tensor& t) const {
  return t.view({t.size(0), options_.num_heads() / 2, 2, t.size(2), head_dim_}).transpose(1, 2);
}

std::vector<int64_t> AttentionImpl::pair_coupling_shape(int64_t batch, int64_t time) const {
  // Separate couplings see the pairs as 2H heads; one shared per-head coupling
  // takes both pairs with the pair axis folded into the batch.
  const int64_t heads = options_.num_heads() / 2;
  return options_.coupling().separate_pairs() ? std::vector<int64_t>{batch, 2 * heads, time, head_dim_}
                                            : std::vector<int64_t>{batch * 2, heads, time, head_dim_};
}

std::pair<at::Tensor, at::Tensor> AttentionImpl::coupling_inputs(const at::Tensor& x) {
  const auto q = split_heads(q_proj(x), options_.num_heads());
  const auto k = split_heads(k_proj(x), kv_heads_);
  if (options_.kind() != AttentionKind::Differential) return {q, expand_kv_heads(k)};
  const auto shape = pair_coupling_shape(x.size(0), x.size(1));
  return {by_pair(q).reshape(shape), by_pair(k).reshape(shape)};
}

std::vector<at::Tensor> AttentionImpl::identity_initialised_parameters() const {
  if (options_.kind() != AttentionKind::MultiToken) return {};
  return {mta_kernel, mta_mixing};
}

ops::BeforeScoring AttentionImpl::before_scoring() const {
  ops::BeforeScoring before;
  if (options_.rope()) before.rope_base = options_.rope_base();
  if (options_.kind() == AttentionKind::QKNorm) {
    before.q_norm = q_norm.get();
    before.k_norm = k_norm.get();
  }
  return before;
}

ops::Scoring AttentionImpl::scoring() const {
  return {[this](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) { return score(q, k, v); }};
}

at::Tensor AttentionImpl::multi_token_logits(const at::Tensor& q, const at::Tensor& k) const {
  if (options_.kind() != AttentionKind::MultiToken)  // only MTA has the convolution's kernel
    throw std::logic_error("multi_token_logits: the attention is " + to_string(options_.kind()) + ", not mta");
  const int64_t time = q.size(2);
  const auto& mta = options_.mta();
  auto logits = at::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(head_dim_));
  const auto future = options_.causal()
                          ? at::ones({time, time}, q.options().dtype(at::kBool)).triu(1)
                          : at::zeros({time, time}, q.options().dtype(at::kBool));
  // Masked logits are zeroed before the convolution and masked again after it,
  // so no future key leaks in through the kernel's reach.
  logits = logits.masked_fill(future, 0.0);
  const int64_t half_key = mta.key_kernel() / 2;
  // Pad queries only on the past side (causal), keys on both sides.
  logits = at::constant_pad_nd(logits, {half_key, half_key, mta.query_kernel() - 1, 0});
  const std::vector<int64_t> ones{1, 1}, no_padding{0, 0};
  logits = at::conv2d(logits, mta_kernel.to(logits.scalar_type()), /*bias=*/at::Tensor(), ones, no_padding, ones,
                      /*groups=*/options_.num_heads());
  return logits.masked_fill(future, -std::numeric_limits<double>::infinity());
}

at::Tensor AttentionImpl::score(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const {
  if (options_.kind() != AttentionKind::MultiToken) {
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, options_.causal());
  }
  // MTA needs the T x T scores explicitly: convolution, softmax, head mixing.
  auto weights = at::softmax(multi_token_logits(q, k), -1);
  const int64_t group = options_.mta().head_group();
  const auto sizes = weights.sizes().vec();
  // [B, H, T, T] -> [B, H/g, g, T*T]; mix the g heads of each group.
  auto grouped = weights.reshape({sizes[0], sizes[1] / group, group, -1});
  weights = at::matmul(mta_mixing.to(weights.scalar_type()).unsqueeze(0), grouped).reshape(sizes);
  return head_norm->forward(at::matmul(weights, v));
}

at::Tensor AttentionImpl::forward(const at::Tensor& x) {
  RECORD_USER_SCOPE("cqk::attention");  // a profiler range (train/step_profiler.h)
  require(x.dim() == 3 && x.size(2) == options_.width(),
          "input must be [batch, time, " + std::to_string(options_.width()) + "], got " + c10::str(x.sizes()));
  auto q = split_heads(q_proj(x), options_.num_heads());
  auto k = split_heads(k_proj(x), kv_heads_);
  if (options_.kind() == AttentionKind::Differential) return forward_differential(q, k, x);

  const auto v = expand_kv_heads(split_heads(v_proj(x), kv_heads_));
  return out_proj(
      merge_heads(ops::coupled_attention(*coupling_, q, expand_kv_heads(k), v, before_scoring(), scoring())));
}

at::Tensor AttentionImpl::forward_differential(const at::Tensor& q, const at::Tensor& k, const at::Tensor& x) {
  const int64_t batch = x.size(0), time = x.size(1), heads = options_.num_heads() / 2;
  const auto v = split_heads(v_proj(x), heads);  // [B, H/2, T, 2d]
  const auto [a1v, a2v] = ops::paired_coupled_attention(*coupling_, by_pair(q), by_pair(k), v, before_scoring(),
                                                        pair_coupling_shape(batch, time), scoring());
  const auto lambda = at::exp((lambda_q1 * lambda_k1).sum()) - at::exp((lambda_q2 * lambda_k2).sum()) + lambda_init_;
  // (A1 - lambda A2) V = A1 V - lambda A2 V: two SDPA calls.
  const auto out = head_norm(a1v - lambda.to(a1v.scalar_type()) * a2v) * (1.0 - lambda_init_);
  return out_proj(merge_heads(out));
}

}  // namespace cqk
