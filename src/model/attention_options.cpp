// The attention's shape rules and a model's per-layer options, torch-free
// (the config loader checks a config with them).
#include "cqk/attention_options.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "cqk/config.h"

namespace cqk {

double differential_lambda_init(int64_t layer_index) {
  return 0.8 - 0.6 * std::exp(-0.3 * static_cast<double>(layer_index));
}

std::optional<ShapeProblem> attention_shape_problem(const AttentionOptions& options) {
  const auto n = [](int64_t v) { return std::to_string(v); };
  const int64_t width = options.width(), heads = options.num_heads(), kv = options.num_kv_heads();
  const bool differential = options.kind() == AttentionKind::Differential;
  const auto& mta = options.mta();
  const auto& coupling = options.coupling();
  // In order, each rule assuming the ones before it hold.
  const auto problem = [](const char* key, const std::string& what) { return std::optional<ShapeProblem>({key, what}); };
  if (width < 1 || heads < 1) return problem("model.heads", "must be positive, as must model.width; got " + n(heads));
  if (width % heads != 0) return problem("model.heads", "must divide model.width (" + n(width) + "), got " + n(heads));
  if (options.rope() && width / heads % 2 != 0)
    return problem("model.heads", "head size model.width / model.heads must be even for RoPE, got " + n(width / heads));
  if (kv < 0 || (kv > 0 && heads % kv != 0))
    return problem("model.kv_heads", "must divide model.heads (" + n(heads) + "), got " + n(kv));
  if (differential && heads % 2 != 0)
    return problem("model.heads", "diff attention needs an even head count, got " + n(heads));
  if (differential && kv != 0 && kv != heads)
    return problem("model.kv_heads", "diff attention needs 0 or model.heads (" + n(heads) + "), got " + n(kv));
  if (mta.query_kernel() < 1)
    return problem("model.attention.mta.query_kernel", "must be >= 1, got " + n(mta.query_kernel()));
  if (mta.key_kernel() < 1 || mta.key_kernel() % 2 == 0)
    return problem("model.attention.mta.key_kernel", "must be odd (centred on the key), got " + n(mta.key_kernel()));
  if (options.kind() == AttentionKind::MultiToken && (mta.head_group() < 1 || heads % mta.head_group() != 0))
    return problem("model.attention.mta.head_group",
                   "must divide model.heads (" + n(heads) + "), got " + n(mta.head_group()));
  if (coupling.hidden() < 1) return problem("model.attention.coupling.hidden", "must be positive, got " + n(coupling.hidden()));
  if (coupling.steps() < 1) return problem("model.attention.coupling.steps", "must be positive, got " + n(coupling.steps()));
  if (!(coupling.clamp() > 0) || !std::isfinite(coupling.clamp()))  // NaN fails every comparison
    return problem("model.attention.coupling.clamp", "must be positive and finite, got " + std::to_string(coupling.clamp()));
  return std::nullopt;
}

AttentionShape attention_shape(const AttentionOptions& options) {
  if (const auto problem = attention_shape_problem(options))
    throw std::invalid_argument("attention: " + problem->key + ": " + problem->what);
  AttentionShape shape;
  shape.head_dim = options.width() / options.num_heads();
  shape.kv_heads = options.num_kv_heads() > 0 ? options.num_kv_heads() : options.num_heads();
  // Differential shares one coupling between its two pairs unless asked otherwise.
  const bool shared_pairs = options.kind() == AttentionKind::Differential && !options.coupling().separate_pairs();
  shape.coupling_heads = shared_pairs ? options.num_heads() / 2 : options.num_heads();
  return shape;
}


AttentionOptions attention_options(const ModelConfig& config, int64_t layer) {
  // The kind's own options come whole from model.attention; the shape from model.*.
  auto options = config.attention;
  if (options.kind() == AttentionKind::MultiToken && (layer + 1) % options.mta().every() != 0)
    options.kind(AttentionKind::Vanilla);
  return options.width(config.width)
      .num_heads(config.heads)
      .num_kv_heads(config.kv_heads)
      .layer_index(layer)
      .rope_base(config.rope_base)
      .norm_eps(config.norm_eps);
}

std::optional<ShapeProblem> model_shape_problem(const ModelConfig& config) {
  const int64_t every = config.attention.mta().every();
  // Without an MTA layer the model is vanilla attention under another name: a
  // 2-layer model with the default every of 4 trained as vanilla, bit for bit.
  if (config.attention.kind() == AttentionKind::MultiToken && every < 1)
    return ShapeProblem{"model.attention.mta.every", "must be at least 1, got " + std::to_string(every)};
  if (config.attention.kind() == AttentionKind::MultiToken && every > config.layers)
    return ShapeProblem{"model.attention.mta.every",
                        "is " + std::to_string(every) + " but the model has " + std::to_string(config.layers) +
                            " layers, so none would use MTA (layer l does when (l + 1) % every == 0); set it to at "
                            "most " + std::to_string(config.layers)};
  // Layers differ only in kind (MTA on every `every`-th) and index: the first
  // layer and the first MTA layer stand for all.
  std::vector<int64_t> layers{0};
  if (config.attention.kind() == AttentionKind::MultiToken) layers.push_back(every - 1);
  for (const int64_t layer : layers)
    if (auto problem = attention_shape_problem(attention_options(config, layer))) return problem;
  return std::nullopt;
}

}  // namespace cqk
