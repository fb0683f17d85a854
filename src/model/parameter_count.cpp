#include "cqk/parameter_count.h"

#include <stdexcept>
#include <string>

#include "cqk/attention.h"

namespace cqk {

namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("count_parameters: " + message);
}

}  // namespace

ParameterBreakdown parameter_breakdown(const ModelConfig& config) {
  require(config.vocab_size >= 2, "model.vocab_size must be at least 2 (0 means 'from the data': set it to count)");
  require(config.layers >= 1, "model.layers must be at least 1");
  require(config.attention.kind() != AttentionKind::MultiToken || config.attention.mta().every() >= 1,
          "model.attention.mta.every must be at least 1");
  ParameterBreakdown counts;
  counts.embedding = config.vocab_size * config.width;  // tied with the output head
  const int64_t mlp = (config.mlp == MlpKind::SwiGlu ? 3 : 2) * config.width * mlp_hidden_size(config);
  for (int64_t layer = 0; layer < config.layers; ++layer) {
    const auto attention = attention_parameter_count(attention_options(config, layer));
    counts.attention += attention.attention;
    counts.coupling += attention.coupling;
    counts.mlp += mlp;
    counts.norm += 2 * config.width;  // attention_norm, mlp_norm
  }
  counts.norm += config.width;  // final_norm
  return counts;
}

int64_t count_parameters(const ModelConfig& config) { return parameter_breakdown(config).total(); }

}  // namespace cqk
