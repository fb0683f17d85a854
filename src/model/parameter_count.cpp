#include "cqk/parameter_count.h"

#include <stdexcept>
#include <string>

#include "cqk/attention.h"
#include "cqk/coupling.h"

namespace cqk {

namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("count_parameters: " + message);
}

// The attention of one layer: (attention parameters, coupling parameters),
// mirroring AttentionImpl's constructor.
std::pair<int64_t, int64_t> attention_count(const AttentionOptions& options) {
  const auto shape = attention_shape(options);
  const int64_t width = options.width(), heads = options.num_heads(), head_dim = shape.head_dim,
                kv_heads = shape.kv_heads;

  // q and out: width x width; k and v: width x (kv_heads * head_dim); no biases.
  int64_t attention = 2 * width * width + 2 * width * kv_heads * head_dim;
  switch (options.kind()) {
    case AttentionKind::Vanilla: break;
    case AttentionKind::QKNorm: attention += 2 * head_dim; break;  // q_norm, k_norm
    case AttentionKind::Differential:
      attention += 4 * head_dim + 2 * head_dim;  // lambda_{q1,k1,q2,k2}, head_norm over 2 * head_dim
      break;
    case AttentionKind::MultiToken: {
      const auto& mta = options.mta();
      attention += heads * mta.query_kernel() * mta.key_kernel()                // kernel [heads, 1, c_q, c_k]
                   + (heads / mta.head_group()) * mta.head_group() * mta.head_group()  // mixing
                   + head_dim;                                                  // head_norm
      break;
    }
  }

  auto coupling = options.coupling();
  coupling.num_heads(shape.coupling_heads).head_dim(head_dim);
  return {attention, coupling_parameter_count(coupling)};
}

}  // namespace

ParameterBreakdown parameter_breakdown(const ModelConfig& config) {
  require(config.vocab_size >= 2, "model.vocab_size must be at least 2 (0 means 'from the data': set it to count)");
  require(config.layers >= 1, "model.layers must be at least 1");
  require(config.mlp == "gelu" || config.mlp == "swiglu", "model.mlp: expected gelu|swiglu, got '" + config.mlp + "'");
  require(config.attention.kind != AttentionKind::MultiToken || config.attention.mta.every() >= 1,
          "model.attention.mta.every must be at least 1");
  ParameterBreakdown counts;
  counts.embedding = config.vocab_size * config.width;  // tied with the output head
  const int64_t mlp = (config.mlp == "swiglu" ? 3 : 2) * config.width * mlp_hidden_size(config);
  for (int64_t layer = 0; layer < config.layers; ++layer) {
    const auto [attention, coupling] = attention_count(attention_options(config, layer));
    counts.attention += attention;
    counts.coupling += coupling;
    counts.mlp += mlp;
    counts.norm += 2 * config.width;  // attention_norm, mlp_norm
  }
  counts.norm += config.width;  // final_norm
  return counts;
}

int64_t count_parameters(const ModelConfig& config) { return parameter_breakdown(config).total(); }

}  // namespace cqk
