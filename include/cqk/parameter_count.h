#pragma once
// The model's parameter count computed from its config alone, without
// building the model (no tensors, no torch allocations): what `cqk inspect`,
// the experiment-grid checks and docs/EXPERIMENTS.md use to size a model.
//
//   cqk::ModelConfig m = cqk::load_config("configs/wikitext103/150m/diff-affine.yaml").model;
//   int64_t n = cqk::count_parameters(m);   // == TransformerLM(m)->parameter_breakdown().total()
//
// The breakdown uses the categories of TransformerLM::parameter_breakdown():
// embedding (tied with the output head, so counted once), attention
// (projections, QK-norm scales, Differential lambdas and head norm, MTA kernel,
// mixing and head norm), coupling, mlp, and norm (the two RMSNorms of each
// block and the final one). Tests keep the two equal for every attention kind
// and coupling kind.
#include <cstdint>

#include "cqk/config.h"
#include "cqk/model.h"

namespace cqk {

// Throws std::invalid_argument when the config cannot describe a model
// (model.vocab_size < 2, e.g. 0 meaning "from the data"; heads not dividing
// width; unknown kinds; ...), with the key named in the message.
ParameterBreakdown parameter_breakdown(const ModelConfig& config);

// parameter_breakdown(config).total().
int64_t count_parameters(const ModelConfig& config);

}  // namespace cqk
