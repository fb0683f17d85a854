#pragma once
// Evaluating a model on a split: what `cqk train` reports every eval_every
// steps and at the end, and what `cqk eval` prints.
//
// Besides the loss per token (which depends on the tokenizer), an evaluation
// reports numbers that compare across tokenizers and datasets:
//   bits per byte   total NLL in bits / the UTF-8 bytes the scored targets stand
//                   for (BatchSource::token_bytes; text data only);
//   word perplexity exp(total NLL / the split's words) (BatchSource::split_words;
//                   only when the whole split was evaluated);
//   seen / unseen   the loss over targets that do / do not occur as targets of
//                   the training split: on out-of-domain text the few tokens the
//                   model never had to predict can dominate the mean.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cqk/batch_source.h"
#include "cqk/model.h"

namespace cqk {

// The mean loss over a subset of the scored targets (none when it is empty).
struct TargetLoss {
  std::optional<double> loss;
  int64_t tokens = 0;
};

struct Evaluation {
  double loss = 0.0;        // mean cross entropy per scored token (nats)
  double perplexity = 0.0;
  double accuracy = 0.0;    // argmax accuracy on scored tokens
  int64_t tokens = 0;
  std::optional<double> bits_per_byte;    // text data
  int64_t bytes = 0;
  std::optional<double> word_perplexity;  // whole split with a known word count
  int64_t words = 0;
  TargetLoss seen, unseen;  // targets that occur / never occur as targets of the training split
};

// Per vocabulary id: how targets are classified and measured.
struct TargetTables {
  std::vector<uint8_t> seen;   // BatchSource::targets_in_training of the model's training data
  std::vector<int32_t> bytes;  // BatchSource::token_bytes; empty: not text
};

// The tables of a source that is both the training data and the evaluated data.
TargetTables target_tables(const BatchSource& source);

// Sums over the scored targets of evaluation batches: they add up over
// batches and over ranks, and every reported metric is a function of them.
struct EvaluationSums {
  double nll = 0.0;       // nats
  double seen_nll = 0.0;
  int64_t tokens = 0, correct = 0, bytes = 0, seen_tokens = 0;

  // As doubles, for DistributedContext::all_reduce_sum (counts stay exact below 2^53).
  std::vector<double> to_vector() const;
  static EvaluationSums from_vector(const std::vector<double>& values);
};

// Sums over the evaluation batches of `split` (this rank's share; max_batches
// <= 0: the whole split): the cross entropy of the float32 logits per target,
// summed in float64. A non-empty `progress` shows "batch i/N | <progress> | eta"
// on stderr (whole splits take minutes at scale).
EvaluationSums evaluation_sums(TransformerLM& model, BatchSource& source, Split split, int64_t max_batches,
                               const c10::Device& device, const TargetTables& tables, const std::string& progress = "");

// The split's word count when max_batches covers the whole split (<= 0), for word perplexity.
std::optional<int64_t> evaluated_words(const BatchSource& source, Split split, int64_t max_batches);

// The metrics of (rank-reduced) sums. Bits per byte when the targets stand for
// some bytes; word perplexity when `words` is given.
Evaluation summarize(const EvaluationSums& sums, std::optional<int64_t> words);

// One process: evaluation_sums, then summarize with evaluated_words.
Evaluation evaluate(TransformerLM& model, BatchSource& source, Split split, int64_t max_batches,
                    const c10::Device& device, const TargetTables& tables, const std::string& progress = "");

}  // namespace cqk
