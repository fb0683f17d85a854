#include "cqk/recall_task.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>
#include <vector>

namespace cqk {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// splitmix64: a small, fast, portable generator (std distributions differ across
// standard libraries, so we draw our own).
struct Rng {
  uint64_t state;
  uint64_t next() { return mix64(state += kGolden); }
  uint64_t below(uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64); }
  double uniform() { return static_cast<double>((next() >> 11) + 1) * 0x1.0p-53; }  // (0, 1]
};

// `count` distinct integers from [lo, hi), in random order (Floyd's algorithm, then a shuffle).
std::vector<int64_t> distinct(Rng& rng, int64_t lo, int64_t hi, int64_t count) {
  std::vector<int64_t> out;
  out.reserve(static_cast<std::size_t>(count));
  const int64_t n = hi - lo;
  for (int64_t j = n - count; j < n; ++j) {
    const auto t = static_cast<int64_t>(rng.below(static_cast<uint64_t>(j + 1)));
    out.push_back(std::find(out.begin(), out.end(), lo + t) == out.end() ? lo + t : lo + j);
  }
  for (int64_t i = count - 1; i > 0; --i) std::swap(out[i], out[rng.below(static_cast<uint64_t>(i + 1))]);
  return out;
}

uint64_t split_tag(Split split) {
  switch (split) {
    case Split::Train: return 0x7472616e;  // "tran"
    case Split::Valid: return 0x76616c69;  // "vali"
    case Split::Test: return 0x74657374;   // "test"
  }
  return 0;
}

}  // namespace

void validate_recall(const RecallConfig& c, int64_t seq_len) {
  if (c.vocab_size < 4) throw std::invalid_argument("data.recall.vocab_size must be >= 4, got " + std::to_string(c.vocab_size));
  if (c.pairs < 1) throw std::invalid_argument("data.recall.pairs must be >= 1, got " + std::to_string(c.pairs));
  const int64_t half = c.vocab_size / 2;
  if (c.pairs > half - 1 || c.pairs > c.vocab_size - half)
    throw std::invalid_argument("data.recall.pairs (" + std::to_string(c.pairs) + ") exceeds the " +
                                std::to_string(half - 1) + " distinct keys of data.recall.vocab_size " +
                                std::to_string(c.vocab_size) + " (keys from [1, V/2), token 0 is the filler)");
  if (seq_len < 3 * c.pairs)
    throw std::invalid_argument("data.seq_len (" + std::to_string(seq_len) + ") cannot hold " + std::to_string(c.pairs) +
                                " key-value pairs and their queries: needs >= 3 * data.recall.pairs = " +
                                std::to_string(3 * c.pairs));
  if (!(c.power_law > 0.0)) throw std::invalid_argument("data.recall.power_law must be > 0");
  if (c.train_examples < 1) throw std::invalid_argument("data.recall.train_examples must be >= 1");
  if (c.eval_examples < 1) throw std::invalid_argument("data.recall.eval_examples must be >= 1");
}

uint64_t recall_example_seed(uint64_t seed, Split split, int64_t index) {
  return mix64(mix64(mix64(seed + kGolden) ^ split_tag(split)) + static_cast<uint64_t>(index) * kGolden);
}

void generate_recall_example(const RecallConfig& c, int64_t seq_len, uint64_t example_seed, int64_t* inputs,
                             int64_t* targets) {
  Rng rng{example_seed};
  const int64_t P = c.pairs, V = c.vocab_size, half = V / 2;
  const auto keys = distinct(rng, 1, half, P);
  const auto values = distinct(rng, half, V, P);
  std::fill(inputs, inputs + seq_len, kRecallFiller);
  std::fill(targets, targets + seq_len, kIgnoredTarget);
  for (int64_t i = 0; i < P; ++i) {
    inputs[2 * i] = keys[i];
    inputs[2 * i + 1] = values[i];
  }
  // Query slots at distance d = 1..R after the pairs, P(d) ~ d^(alpha - 1), drawn
  // without replacement (Efraimidis-Spirakis: the P largest log(u) / w).
  const int64_t R = seq_len - 2 * P;
  std::vector<std::pair<double, int64_t>> keyed(static_cast<std::size_t>(R));
  for (int64_t d = 1; d <= R; ++d) {
    const double weight = std::pow(static_cast<double>(d), c.power_law - 1.0);
    keyed[static_cast<std::size_t>(d - 1)] = {std::log(rng.uniform()) / weight, d};
  }
  std::nth_element(keyed.begin(), keyed.begin() + (P - 1), keyed.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<int64_t> slots;
  slots.reserve(static_cast<std::size_t>(P));
  for (int64_t i = 0; i < P; ++i) slots.push_back(keyed[static_cast<std::size_t>(i)].second);
  std::sort(slots.begin(), slots.end());
  // Which pair each query asks for: a random permutation.
  std::vector<int64_t> order(static_cast<std::size_t>(P));
  for (int64_t i = 0; i < P; ++i) order[i] = i;
  for (int64_t i = P - 1; i > 0; --i) std::swap(order[i], order[rng.below(static_cast<uint64_t>(i + 1))]);
  for (int64_t i = 0; i < P; ++i) {
    const int64_t pos = 2 * P + slots[i] - 1;
    inputs[pos] = keys[order[i]];
    targets[pos] = values[order[i]];
  }
}

namespace {

at::Tensor make_pool(const RecallConfig& c, int64_t seq_len, uint64_t seed, Split split, int64_t examples) {
  auto pool = at::empty({examples, 2, seq_len}, at::kInt);
  auto* data = pool.data_ptr<int32_t>();
  at::parallel_for(0, examples, 64, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> inputs(static_cast<std::size_t>(seq_len)), targets(static_cast<std::size_t>(seq_len));
    for (int64_t i = begin; i < end; ++i) {
      generate_recall_example(c, seq_len, recall_example_seed(seed, split, i), inputs.data(), targets.data());
      int32_t* row = data + i * 2 * seq_len;
      std::copy(inputs.begin(), inputs.end(), row);
      std::copy(targets.begin(), targets.end(), row + seq_len);
    }
  });
  return pool;
}

Batch rows_of(const at::Tensor& pool, const at::Tensor& index) {
  auto picked = pool.index_select(0, index).to(at::kLong);
  return {picked.select(1, 0).contiguous(), picked.select(1, 1).contiguous()};
}

}  // namespace

RecallTask::RecallTask(const DataConfig& config, int64_t seed, int rank, int world_size)
    : config_(config), seed_(static_cast<uint64_t>(seed)), rank_(rank), world_size_(world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw std::invalid_argument("rank " + std::to_string(rank) + " outside world size " + std::to_string(world_size));
  if (config.batch_size < 1) throw std::invalid_argument("data.batch_size must be >= 1");
  if (config.batch_size % world_size != 0)
    throw std::invalid_argument("data.batch_size (" + std::to_string(config.batch_size) +
                                ") must be divisible by the world size (" + std::to_string(world_size) + ")");
  validate_recall(config.recall, config.seq_len);
  rows_ = config.batch_size / world_size;
  train_pool_ = make_pool(config.recall, config.seq_len, seed_, Split::Train, config.recall.train_examples);
}

RecallTask::~RecallTask() = default;

Batch RecallTask::train_batch(int64_t n) const {
  auto index = at::empty({rows_}, at::kLong);
  auto* idx = index.data_ptr<int64_t>();
  const auto examples = static_cast<uint64_t>(config_.recall.train_examples);
  for (int64_t i = 0; i < rows_; ++i) {
    const auto sequence = static_cast<uint64_t>(training_sequence(n, config_.batch_size, rank_ * rows_ + i));
    Rng rng{mix64(mix64(seed_ ^ 0x5851f42d4c957f2dULL) ^ (sequence * 0xd6e8feb86659fd93ULL))};
    idx[i] = static_cast<int64_t>(rng.below(examples));
  }
  return rows_of(train_pool_, index);
}

std::vector<uint8_t> RecallTask::targets_in_training() const {
  const auto targets = train_pool_.select(1, 1).flatten();
  const auto scored = targets.masked_select(targets.ne(kIgnoredTarget)).to(at::kLong);
  const auto seen = at::zeros({vocab_size()}, at::kByte).index_fill_(0, scored, 1);
  return {seen.data_ptr<uint8_t>(), seen.data_ptr<uint8_t>() + seen.numel()};
}

Batch RecallTask::next_train() { return train_batch(position_++); }

void RecallTask::seek_train(int64_t position) {
  if (position < 0) throw std::invalid_argument("seek_train: negative position " + std::to_string(position));
  position_ = position;
}

const at::Tensor& RecallTask::pool(Split split) {
  std::lock_guard<std::mutex> lock(eval_mutex_);
  if (split == Split::Train) return train_pool_;
  auto& pool = split == Split::Valid ? valid_pool_ : test_pool_;
  if (!pool.defined()) pool = make_pool(config_.recall, config_.seq_len, seed_, split, config_.recall.eval_examples);
  return pool;
}

std::vector<Batch> RecallTask::eval_batches(Split split, int64_t max_batches) {
  const at::Tensor& examples = pool(split);
  const int64_t total = examples.size(0);
  const int64_t B = config_.batch_size, L = config_.seq_len;
  int64_t batches = (total + B - 1) / B;
  if (max_batches > 0) batches = std::min(batches, max_batches);
  std::vector<Batch> out;
  for (int64_t b = 0; b < batches; ++b) {
    const int64_t first = b * B;
    const int64_t n = std::min(B, total - first);
    const int64_t rows = n == B ? rows_ : (n + world_size_ - 1) / world_size_;
    const int64_t lo = std::min(n, rank_ * rows), hi = std::min(n, (rank_ + 1) * rows);
    auto index = at::arange(first + lo, first + hi, at::kLong);
    Batch batch = rows_of(examples, index);
    if (hi - lo < rows) {  // pad the partial last batch: filler inputs, nothing scored
      const int64_t pad = rows - (hi - lo);
      batch.inputs = at::cat({batch.inputs, at::full({pad, L}, kRecallFiller, at::kLong)});
      batch.targets = at::cat({batch.targets, at::full({pad, L}, kIgnoredTarget, at::kLong)});
    }
    out.push_back(std::move(batch));
  }
  return out;
}

AccuracyCount scored_accuracy(const at::Tensor& logits, const at::Tensor& targets) {
  if (logits.dim() != 3 || targets.dim() != 2 || logits.size(0) != targets.size(0) || logits.size(1) != targets.size(1))
    throw std::invalid_argument("scored_accuracy: expected logits [B, T, V] and targets [B, T], got " +
                                std::to_string(logits.dim()) + "-d logits and " + std::to_string(targets.dim()) +
                                "-d targets of other sizes");
  const auto t = targets.to(logits.device(), at::kLong);
  const auto scored = t.ne(kIgnoredTarget);
  const auto correct = logits.argmax(-1).eq(t).logical_and(scored);
  return {correct.sum().item<int64_t>(), scored.sum().item<int64_t>()};
}

}  // namespace cqk
