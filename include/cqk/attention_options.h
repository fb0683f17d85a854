#pragma once
// The attention's kinds and options, and the shape rules they must keep.
// AttentionOptions is also the config section model.attention (its kind,
// head_norm_init, mta and coupling are the keys), as MultiTokenOptions is model.attention.mta and
// CouplingOptions (coupling_options.h) model.attention.coupling: one struct,
// one set of defaults. Torch-free: the config loader reads it.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cqk/coupling_options.h"
#include "cqk/kind_table.h"
#include "cqk/option.h"

namespace cqk {

struct ModelConfig;  // config.h

enum class AttentionKind {
  Vanilla,       // softmax(q k^T / sqrt(d)) v, fused SDPA
  Differential,  // (softmax(q1 k1^T) - lambda softmax(q2 k2^T)) v, arXiv 2410.05258
  QKNorm,        // per-head RMSNorm of q and k before scoring
  MultiToken,    // key-query convolution over the logits + head mixing, arXiv 2504.00927
};

// The config names, in enum order: what model.attention.kind accepts.
inline const KindTable<AttentionKind, 4> kAttentionKindNames = {{AttentionKind::Vanilla, "vanilla"},
                                                                {AttentionKind::Differential, "diff"},
                                                                {AttentionKind::QKNorm, "qknorm"},
                                                                {AttentionKind::MultiToken, "mta"}};

inline const std::vector<std::string>& attention_kind_names() { return kind_names<kAttentionKindNames>(); }
// Throws std::invalid_argument "unknown attention kind 'x' (expected vanilla|diff|...)".
inline AttentionKind parse_attention_kind(const std::string& name) {
  return parse_kind(kAttentionKindNames, name, "attention kind");
}
inline std::string to_string(AttentionKind kind) { return kind_name(kAttentionKindNames, kind); }

// Differential attention's lambda vectors start as N(0, this^2) per component.
constexpr double kDifferentialLambdaInitStd = 0.1;

struct MultiTokenOptions {
  CQK_OPTION(int64_t, every) = 4;         // the model's layers l with (l + 1) % every == 0 use MTA
  CQK_OPTION(int64_t, query_kernel) = 6;  // c_q, causal over queries
  CQK_OPTION(int64_t, key_kernel) = 11;   // c_k, odd, centred on the key
  CQK_OPTION(int64_t, head_group) = 2;    // heads mixed within groups of this size
};

struct AttentionOptions {
  AttentionOptions() = default;
  AttentionOptions(int64_t width, int64_t num_heads) : width_(width), num_heads_(num_heads) {}

  CQK_OPTION(AttentionKind, kind) = AttentionKind::Vanilla;
  CQK_OPTION(int64_t, width) = 128;
  // Query heads of size width / num_heads. Differential pairs them: num_heads/2
  // heads, each with two (q, k) pairs and a value of twice the head size.
  CQK_OPTION(int64_t, num_heads) = 4;
  // Key/value heads (grouped-query attention); 0 means num_heads.
  CQK_OPTION(int64_t, num_kv_heads) = 0;
  CQK_OPTION(int64_t, layer_index) = 0;  // sets Differential's lambda_init
  CQK_OPTION(bool, rope) = true;
  CQK_OPTION(double, rope_base) = 10000.0;
  CQK_OPTION(bool, causal) = true;
  CQK_OPTION(double, norm_eps) = 1e-5;
  CQK_OPTION(MultiTokenOptions, mta) = {};
  // The initial weight of Differential's and MTA's per-head output RMSNorm.
  // 1.0 is the papers'; that output then starts far above a 0.02-std residual
  // stream, which keeps small models from learning recall (docs/EXPERIMENTS.md).
  CQK_OPTION(double, head_norm_init) = 1.0;
  // The coupling; its num_heads and head_dim are set by the attention.
  CQK_OPTION(CouplingOptions, coupling) = {};
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

// The attention options of layer `layer` of a model (MTA only on its chosen layers).
AttentionOptions attention_options(const ModelConfig& config, int64_t layer);
// The first shape rule (attention_shape_problem) a layer of `config` breaks, or nullopt.
std::optional<ShapeProblem> model_shape_problem(const ModelConfig& config);

}  // namespace cqk
