#pragma once
// The `data.kind: tokens` batch source: memory-mapped train.bin, valid.bin and
// test.bin (token_file.h) in DataConfig::dir.
//
// Training: global batch n is batch_size windows of seq_len + 1 contiguous
// tokens, training sequences n * batch_size + j for j < batch_size; sequence s
// starts at train_window_start(seed, s, ...), a counter-based hash, so batch n
// depends only on (seed, n, batch_size) and seek_train is O(1). A step of
// grad_accum micro-batches draws sequences [step * B * grad_accum, ... + B *
// grad_accum) whatever the split of that product into B and grad_accum. Rank r of
// W takes rows [r*B/W, (r+1)*B/W) of the global batch (B % W must be 0). A
// background thread keeps DataConfig::prefetch batches ready (0: none); it
// produces exactly the batches next_train would, so prefetching never changes
// what is drawn.
//
// Evaluation: windows at 0, stride, 2*stride, ... (stride = eval_stride, 0 for
// seq_len), the last one moved back to end at the split's last token. Every
// target token 1..N-1 of the split is scored exactly once: a window scores only
// targets after those of the previous window (with stride < seq_len, the last
// `stride` ones), the others are -1. Global batches of batch_size windows are
// cut into rank slices the same way as training; the last, partial batch is
// padded (inputs 0, targets -1) to a multiple of the world size when W > 1.
// Compute loss as (sum over scored targets) / (number scored) across batches.
//
// For evaluation reports the folder's tokenizer.model (copied there by `cqk
// data encode`; it must match the token files' checksum) gives each id's byte
// length, and meta.json each split's word count (used while its token count
// matches the file's). Without them there is no bits per byte / word perplexity.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cqk/batch_source.h"
#include "cqk/config.h"

namespace cqk {

// One evaluation window: inputs are tokens [start, start + seq_len), targets
// tokens [start + 1, start + seq_len + 1); targets before row index
// `first_scored` (and any past the split's end) are -1.
struct EvalWindow {
  int64_t start = 0;
  int64_t first_scored = 0;
};

// Windows of one evaluation pass over a split of `tokens` tokens.
// stride in [1, seq_len]; a split shorter than seq_len + 1 gives one padded window.
std::vector<EvalWindow> eval_windows(int64_t tokens, int64_t seq_len, int64_t stride);

// Start of training sequence `sequence` (global batch n holds sequences
// [n * batch_size, (n + 1) * batch_size)): uniform in [0, max_start].
int64_t train_window_start(uint64_t seed, int64_t sequence, int64_t max_start);

// Which splits a token folder must hold: all three to train, or valid and test
// to evaluate a finished run on another folder (`cqk eval RUN --data DIR`, e.g.
// an evaluation-only folder from `cqk data encode --input FILE`); without a
// train.bin the training batches and targets_in_training() throw.
enum class TokenFolder { Training, Evaluation };

class TokenBatchSource final : public BatchSource {
 public:
  TokenBatchSource(const DataConfig& config, int64_t seed, int rank = 0, int world_size = 1,
                   TokenFolder folder = TokenFolder::Training);
  ~TokenBatchSource() override;

  Batch next_train() override;
  int64_t train_position() const override { return position_; }
  void seek_train(int64_t position) override;
  std::vector<Batch> eval_batches(Split split, int64_t max_batches) override;
  int64_t vocab_size() const override;
  std::vector<uint8_t> targets_in_training() const override;
  std::vector<int32_t> token_bytes() const override { return token_bytes_; }
  std::optional<int64_t> split_words(Split split) const override;

  // Training batch n for this rank, without touching the position.
  Batch train_batch(int64_t n) const;
  uint64_t tokenizer_checksum() const;

 private:
  class Prefetcher;
  struct Files;

  DataConfig config_;
  uint64_t seed_;
  int rank_, world_size_;
  int64_t rows_;  // per-rank batch rows
  std::shared_ptr<const Files> files_;
  std::vector<int32_t> token_bytes_;                 // empty: no tokenizer.model in the folder
  std::optional<int64_t> words_[3];                  // per Split, from meta.json
  int64_t position_ = 0;
  std::unique_ptr<Prefetcher> prefetcher_;
};

// The tokenizer that turns a run's ids into text: for token files the folder's
// tokenizer.model, checked against the training split's tokenizer checksum;
// none for the recall task (ids only). Throws std::runtime_error naming the
// file when a token folder has no tokenizer.model or a different one.
std::optional<std::string> data_tokenizer_path(const DataConfig& data);

// What a run trains and is evaluated on, as far as a later command can check
// it: for token files "tokenizer 0x..., train.bin N tokens, valid.bin M
// tokens, test.bin K tokens" (the splits' headers), empty for the recall task
// (generated from the config). A run records it in its checkpoints
// (TrainingState::data_fingerprint).
std::string data_fingerprint(const DataConfig& data);
// Throws std::runtime_error when `recorded` (a checkpoint's; empty: not
// recorded) is not data.dir's fingerprint now: a relative data.dir read from
// another folder, or a folder encoded again, would otherwise pass silently.
// Passes when data.dir holds no train.bin (the commands that need it say so),
// and for a record of train.bin alone (earlier builds) that data.dir's starts with.
void check_data_fingerprint(const std::string& recorded, const DataConfig& data);

}  // namespace cqk
