#pragma once
// Where training and evaluation batches come from. The trainer sees only this
// interface; the generated associative-recall task and the token files of
// `cqk data encode` both implement it.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cqk/config.h"
#include "cqk/ignored_target.h"

namespace cqk {

enum class Split { Train, Valid, Test };
std::string split_name(Split split);

// inputs and targets: [batch, seq_len] int64 on the CPU. A target of
// kIgnoredTarget is not scored (the recall task scores only the answer positions).
struct Batch {
  at::Tensor inputs;
  at::Tensor targets;
};

// The global index of training sequence `row` of global batch `batch` (row in
// [0, batch_size), counted over all ranks): the key of its draw, so that a
// step's sequences depend neither on the world size nor on the step's split
// into micro-batches (batch_size x train.grad_accum).
constexpr int64_t training_sequence(int64_t batch, int64_t batch_size, int64_t row) {
  return batch * batch_size + row;
}

class BatchSource {
 public:
  virtual ~BatchSource() = default;

  // The next training batch for this rank. Batch n depends only on the seed, batch_size,
  // n, the rank and the world size, so a resumed run draws the same batches.
  virtual Batch next_train() = 0;
  // How many training batches have been drawn (stored in checkpoints).
  virtual int64_t train_position() const = 0;
  virtual void seek_train(int64_t position) = 0;

  // Deterministic evaluation batches of a split (this rank's share);
  // max_batches <= 0 means the whole split.
  virtual std::vector<Batch> eval_batches(Split split, int64_t max_batches) = 0;

  virtual int64_t vocab_size() const = 0;

  // What evaluations report besides the loss (evaluation.h):
  // Per vocabulary id, 1 when the id occurs as a scored target of the training
  // split (the seen/unseen split of the loss), else 0. A pass over the
  // training split: compute it once per run, not per evaluation.
  virtual std::vector<uint8_t> targets_in_training() const = 0;
  // Per vocabulary id, the UTF-8 bytes its token stands for in the text (bits
  // per byte); empty when the data is not text (the recall task).
  virtual std::vector<int32_t> token_bytes() const { return {}; }
  // The words of a split, text_corpus.h's line_words summed over its lines
  // (word-level perplexity); nullopt when unknown.
  virtual std::optional<int64_t> split_words(Split /*split*/) const { return std::nullopt; }
};

// rank/world_size: this process's share of each global batch (data parallel).
std::unique_ptr<BatchSource> make_batch_source(const DataConfig& config, int64_t seed, int rank = 0,
                                               int world_size = 1);

}  // namespace cqk
