#include "cqk/evaluation.h"

#include <ATen/ATen.h>

#include <cmath>
#include <optional>
#include <stdexcept>

#include "cqk/progress.h"
#include "cqk/recall_task.h"

namespace cqk {

TargetTables target_tables(const BatchSource& source) { return {source.targets_in_training(), source.token_bytes()}; }

std::vector<double> EvaluationSums::to_vector() const {
  return {nll, seen_nll, static_cast<double>(tokens), static_cast<double>(correct), static_cast<double>(bytes),
          static_cast<double>(seen_tokens)};
}

EvaluationSums EvaluationSums::from_vector(const std::vector<double>& values) {
  if (values.size() != 6)
    throw std::invalid_argument("EvaluationSums::from_vector: expected 6 values, got " + std::to_string(values.size()));
  EvaluationSums sums;
  sums.nll = values[0];
  sums.seen_nll = values[1];
  sums.tokens = std::llround(values[2]);
  sums.correct = std::llround(values[3]);
  sums.bytes = std::llround(values[4]);
  sums.seen_tokens = std::llround(values[5]);
  return sums;
}

namespace {

// A per-id table as a tensor on `device`, checked against the vocabulary.
template <typename T>
at::Tensor table_tensor(const std::vector<T>& table, int64_t vocab, at::ScalarType type, const c10::Device& device,
                        const char* what) {
  if (static_cast<int64_t>(table.size()) != vocab)
    throw std::invalid_argument(std::string("evaluation: the ") + what + " table has " + std::to_string(table.size()) +
                                " entries for a vocabulary of " + std::to_string(vocab));
  return at::tensor(at::ArrayRef<T>(table)).to(device, type);
}

}  // namespace

EvaluationSums evaluation_sums(TransformerLM& model, BatchSource& source, Split split, int64_t max_batches,
                               const c10::Device& device, const TargetTables& tables, const std::string& progress) {
  const int64_t vocab = source.vocab_size();
  const auto seen = table_tensor(tables.seen, vocab, at::kBool, device, "seen");
  const auto bytes = tables.bytes.empty() ? at::zeros({vocab}, at::TensorOptions(at::kLong).device(device))
                                          : table_tensor(tables.bytes, vocab, at::kLong, device, "byte length");
  at::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  EvaluationSums sums;
  const auto batches = source.eval_batches(split, max_batches);
  const auto count = static_cast<int64_t>(batches.size());
  std::optional<ProgressLine> line;
  if (!progress.empty()) line.emplace(count, 0, (count + 9) / 10, "batch");  // about ten lines in a log
  int64_t done = 0;
  for (const auto& batch : batches) {
    const auto inputs = batch.inputs.to(device), targets = batch.targets.to(device);
    const auto logits = model->forward(inputs).to(at::kFloat);
    const auto flat = targets.reshape(-1);
    // Per target, 0 where not scored; float64 from here on.
    const auto nll = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), flat, {}, at::Reduction::None,
                                            kIgnoredTarget)
                         .to(at::kDouble);
    const auto scored = flat.ne(kIgnoredTarget);
    const auto ids = flat.clamp_min(0);
    const auto seen_scored = seen.index_select(0, ids).logical_and(scored);
    const auto batch_sums = at::stack({nll.sum(), nll.mul(seen_scored).sum(),
                                       bytes.index_select(0, ids).mul(scored).sum().to(at::kDouble),
                                       seen_scored.sum().to(at::kDouble)})
                                .cpu();
    const auto* s = batch_sums.data_ptr<double>();
    const AccuracyCount accuracy = scored_accuracy(logits, targets);
    sums.nll += s[0];
    sums.seen_nll += s[1];
    sums.bytes += std::llround(s[2]);
    sums.seen_tokens += std::llround(s[3]);
    sums.tokens += accuracy.total;
    sums.correct += accuracy.correct;
    if (line) line->update(++done, progress);
  }
  if (line) line->finish();
  model->train(was_training);
  return sums;
}

std::optional<int64_t> evaluated_words(const BatchSource& source, Split split, int64_t max_batches) {
  if (max_batches > 0) return std::nullopt;
  return source.split_words(split);
}

Evaluation summarize(const EvaluationSums& sums, std::optional<int64_t> words) {
  const auto mean = [](double total, int64_t count) -> std::optional<double> {
    if (count <= 0) return std::nullopt;
    return total / static_cast<double>(count);
  };
  Evaluation e;
  e.tokens = sums.tokens;
  e.loss = mean(sums.nll, sums.tokens).value_or(0.0);
  e.perplexity = std::exp(e.loss);
  e.accuracy = mean(static_cast<double>(sums.correct), sums.tokens).value_or(0.0);
  e.bytes = sums.bytes;
  if (sums.bytes > 0) e.bits_per_byte = sums.nll / std::log(2.0) / static_cast<double>(sums.bytes);
  if (words && *words > 0) {
    e.words = *words;
    e.word_perplexity = std::exp(sums.nll / static_cast<double>(*words));
  }
  e.seen = {mean(sums.seen_nll, sums.seen_tokens), sums.seen_tokens};
  const int64_t unseen_tokens = sums.tokens - sums.seen_tokens;
  e.unseen = {mean(sums.nll - sums.seen_nll, unseen_tokens), unseen_tokens};
  return e;
}

Evaluation evaluate(TransformerLM& model, BatchSource& source, Split split, int64_t max_batches,
                    const c10::Device& device, const TargetTables& tables, const std::string& progress) {
  return summarize(evaluation_sums(model, source, split, max_batches, device, tables, progress),
                   evaluated_words(source, split, max_batches));
}

}  // namespace cqk
