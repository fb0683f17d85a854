#pragma once
// How evaluations are written: results.json and `cqk eval --json` (nested),
// metrics.jsonl (flat) and one line of text. Kept out of evaluation.h (and the
// umbrella header) so that the library's API does not need nlohmann/json.
#include <nlohmann/json.hpp>

#include <string>

#include <vector>

#include "cqk/coupling_diagnostics.h"
#include "cqk/evaluation.h"

namespace cqk {

// {"loss", "ppl", "accuracy", "tokens", "bpb", "bytes", "word_ppl", "words",
//  "seen": {"loss", "tokens"}, "unseen": {"loss", "tokens"}}. A metric that
// does not apply is left out with its count: bpb and bytes without text,
// word_ppl and words for part of a split, the loss of an empty subset.
nlohmann::json evaluation_json(const Evaluation& evaluation);

// evaluation_json flattened for a metrics.jsonl line: nested keys joined with
// '_' after `prefix` ("valid_": valid_loss, valid_bpb, valid_seen_loss, ...).
nlohmann::json flat_evaluation_json(const std::string& prefix, const Evaluation& evaluation);

// "ppl P | loss L | accuracy A | tokens N | bpb B | word ppl W | seen loss S (n) | unseen loss U (m)",
// leaving out what evaluation_json leaves out.
std::string describe(const Evaluation& evaluation);

// [{"layer", "q_change", "k_change", "mean_abs_log_scale", "mean_log_det"}, ...]
// (the last two only where known): the "coupling" of metrics.jsonl's eval
// lines and of results.json.
nlohmann::json coupling_json(const std::vector<CouplingDiagnostics>& layers);
std::vector<CouplingDiagnostics> coupling_from_json(const nlohmann::json& layers);

// "coupling over N layers: q change Q | k change K | mean |s| S | log det D",
// means over the layers (`cqk inspect RUN_DIR` shows each layer).
std::string describe(const std::vector<CouplingDiagnostics>& layers);

}  // namespace cqk
