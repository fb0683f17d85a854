#pragma once
// Where training and evaluation batches come from. The trainer sees only this
// interface; the generated associative-recall task and the token files of
// `cqk data encode` both implement it.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cqk/config.h"

namespace cqk {

enum class Split { Train, Valid, Test };
std::string split_name(Split split);

// inputs and targets: [batch, seq_len] int64 on the CPU. A target of -1 is not
// scored (the recall task scores only the answer positions).
struct Batch {
  at::Tensor inputs;
  at::Tensor targets;
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;

  // The next training batch for this rank. Batch n depends only on the seed,
  // n, the rank and the world size, so a resumed run draws the same batches.
  virtual Batch next_train() = 0;
  // How many training batches have been drawn (stored in checkpoints).
  virtual int64_t train_position() const = 0;
  virtual void seek_train(int64_t position) = 0;

  // Deterministic evaluation batches of a split (this rank's share);
  // max_batches <= 0 means the whole split.
  virtual std::vector<Batch> eval_batches(Split split, int64_t max_batches) = 0;

  virtual int64_t vocab_size() const = 0;
};

// rank/world_size: this process's share of each global batch (data parallel).
std::unique_ptr<BatchSource> make_batch_source(const DataConfig& config, int64_t seed, int rank = 0,
                                               int world_size = 1);

}  // namespace cqk
