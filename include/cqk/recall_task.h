#pragma once
// Multi-query associative recall (MQAR, Zoology: arXiv 2312.04927), the
// `data.kind: recall` batch source. Generated, no download.
//
// A sequence of seq_len tokens with V = recall.vocab_size:
//   positions [0, 2P)       P = recall.pairs key-value pairs k1 v1 k2 v2 ...;
//                           keys distinct, from [1, V/2); values distinct, from [V/2, V)
//   positions [2P, seq_len) every key once more, as a query, at positions chosen
//                           without replacement with P(distance d) ~ d^(power_law - 1)
//                           (d = 1 is the position right after the pairs); all
//                           other positions hold the filler token 0
// targets: -1 everywhere except at each query position, whose target is the
// value that followed that key in the pairs. seq_len must be >= 3P.
//
// Training draws from a fixed pool of recall.train_examples sequences (example i
// generated from (seed, train, i)); row j of global batch n is pool example
// hash(seed, n * batch_size + j) mod train_examples: as in token_loader.h, the
// sequences of a step do not depend on how it is split into micro-batches.
// Valid and test are recall.eval_examples sequences from their own streams.
// Ranks and the partial last eval batch are cut as in token_loader.h.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>

#include "cqk/batch_source.h"
#include "cqk/config.h"

namespace cqk {

inline constexpr int64_t kRecallFiller = 0;

// Checks the recall options against seq_len; std::invalid_argument naming the option.
void validate_recall(const RecallConfig& config, int64_t seq_len);

// Writes one sequence (seq_len inputs and targets) generated from `example_seed`.
void generate_recall_example(const RecallConfig& config, int64_t seq_len, uint64_t example_seed, int64_t* inputs,
                             int64_t* targets);

// Seed of example `index` of a split's stream.
uint64_t recall_example_seed(uint64_t seed, Split split, int64_t index);

class RecallTask final : public BatchSource {
 public:
  RecallTask(const DataConfig& config, int64_t seed, int rank = 0, int world_size = 1);
  ~RecallTask() override;

  Batch next_train() override;
  int64_t train_position() const override { return position_; }
  void seek_train(int64_t position) override;
  std::vector<Batch> eval_batches(Split split, int64_t max_batches) override;
  int64_t vocab_size() const override { return config_.recall.vocab_size; }
  std::vector<uint8_t> targets_in_training() const override;  // the values the training pool asks for

  // Training batch n for this rank, without touching the position.
  Batch train_batch(int64_t n) const;

 private:
  const at::Tensor& pool(Split split);  // [examples, 2, seq_len] int32 (inputs, targets)

  DataConfig config_;
  uint64_t seed_;
  int rank_, world_size_;
  int64_t rows_;
  int64_t position_ = 0;
  at::Tensor train_pool_;
  std::mutex eval_mutex_;
  at::Tensor valid_pool_, test_pool_;
};

// Argmax accuracy on scored positions (targets >= 0), for logits [B, T, V] and
// targets [B, T] (any devices; counted on the logits' device).
struct AccuracyCount {
  int64_t correct = 0;
  int64_t total = 0;
  double accuracy() const { return total > 0 ? static_cast<double>(correct) / static_cast<double>(total) : 0.0; }
  AccuracyCount& operator+=(const AccuracyCount& other) {
    correct += other.correct;
    total += other.total;
    return *this;
  }
};
AccuracyCount scored_accuracy(const at::Tensor& logits, const at::Tensor& targets);

}  // namespace cqk
