#include "cqk/token_loader.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "cqk/log.h"
#include "support/seed_mixing.h"
#include "cqk/token_file.h"
#include "cqk/tokenizer.h"

namespace cqk {
namespace {

// Rows [rank*B/W, (rank+1)*B/W) of a global batch of B rows.
void check_batch_split(int64_t batch_size, int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw std::invalid_argument("rank " + std::to_string(rank) + " outside world size " + std::to_string(world_size));
  if (batch_size < 1) throw std::invalid_argument("data.batch_size must be >= 1, got " + std::to_string(batch_size));
  if (batch_size % world_size != 0)
    throw std::invalid_argument("data.batch_size (" + std::to_string(batch_size) +
                                ") must be divisible by the world size (" + std::to_string(world_size) + ")");
}

}  // namespace

int64_t train_window_start(uint64_t seed, int64_t sequence, int64_t max_start) {
  const uint64_t h = splitmix64(splitmix64(seed) ^ (static_cast<uint64_t>(sequence) * 0xd6e8feb86659fd93ULL));
  // Multiply-shift maps the hash onto [0, max_start] (bias < max_start / 2^64).
  return static_cast<int64_t>((static_cast<unsigned __int128>(h) * static_cast<uint64_t>(max_start + 1)) >> 64);
}

std::vector<EvalWindow> eval_windows(int64_t tokens, int64_t seq_len, int64_t stride) {
  if (seq_len < 1) throw std::invalid_argument("data.seq_len must be >= 1");
  if (stride < 1 || stride > seq_len)
    throw std::invalid_argument("data.eval_stride must be in [1, seq_len=" + std::to_string(seq_len) + "] (0: seq_len), got " +
                                std::to_string(stride));
  std::vector<EvalWindow> windows;
  const int64_t last_target = tokens - 1;  // targets are token indices 1..N-1
  int64_t covered = 0;                     // targets 1..covered are scored
  for (int64_t start = 0; covered < last_target; start += stride) {
    const int64_t s = std::min(start, std::max<int64_t>(0, last_target - seq_len));
    windows.push_back({s, covered - s});
    covered = std::min(s + seq_len, last_target);
  }
  return windows;
}

// --- the three memory-mapped splits ----------------------------------------------

struct TokenBatchSource::Files {
  std::string dir;
  std::optional<TokenFile> train;  // absent in an evaluation-only folder
  TokenFile valid, test;
  const TokenFile& get(Split split) const {
    switch (split) {
      case Split::Train: return training();
      case Split::Valid: return valid;
      case Split::Test: return test;
    }
    throw std::invalid_argument("unknown split");
  }
  const TokenFile& training() const {
    if (!train) throw std::runtime_error(dir + " has no train.bin (an evaluation-only folder: it can be evaluated on, not trained on)");
    return *train;
  }
  // The file the others must agree with: train.bin, or valid.bin without it.
  const TokenFile& reference() const { return train ? *train : valid; }
};

namespace {

namespace fs = std::filesystem;

std::string split_path(const std::string& dir, const char* name) {
  return (fs::path(dir) / (std::string(name) + ".bin")).string();
}

TokenFile open_split(const std::string& dir, const char* name) {
  if (dir.empty()) throw std::invalid_argument("data.dir is empty: data.kind tokens needs the folder written by `cqk data encode`");
  const auto path = split_path(dir, name);
  if (!fs::exists(path))
    throw std::runtime_error("token file " + path + " does not exist (data.dir should hold train.bin, valid.bin, test.bin from `cqk data encode`)");
  return TokenFile(path);
}

// Byte length of every id, from the folder's copy of the tokenizer; empty without one.
std::vector<int32_t> read_token_bytes(const std::string& dir, uint64_t checksum) {
  const auto path = (fs::path(dir) / "tokenizer.model").string();
  if (!fs::exists(path)) return {};
  if (const uint64_t actual = file_checksum(path); actual != checksum)
    throw std::runtime_error(path + ": checksum " + checksum_hex(actual) +
                             " differs from the token files' tokenizer checksum " + checksum_hex(checksum) +
                             " (encode the folder again with `cqk data encode`)");
  return Tokenizer(path).piece_byte_lengths();
}

// meta.json's word count of `split`, while its token count is the file's (not a stale meta.json).
std::optional<int64_t> read_split_words(const nlohmann::json& meta, const char* split, const TokenFile& file) {
  const auto* entry = meta.contains("splits") && meta["splits"].contains(split) ? &meta["splits"][split] : nullptr;
  if (!entry || !entry->contains("words") || !entry->contains("tokens")) return std::nullopt;
  if ((*entry)["tokens"].get<int64_t>() != file.size()) return std::nullopt;
  return (*entry)["words"].get<int64_t>();
}

// Fills row `row` of [rows, seq_len] inputs/targets from window `w` of `file`.
void fill_eval_row(const TokenFile& file, const EvalWindow& w, int64_t seq_len, int64_t* inputs, int64_t* targets) {
  const int64_t n = file.size();
  const int64_t in_len = std::clamp<int64_t>(n - w.start, 0, seq_len);
  file.read(w.start, in_len, inputs);
  std::fill(inputs + in_len, inputs + seq_len, 0);
  const int64_t tg_len = std::clamp<int64_t>(n - w.start - 1, 0, seq_len);
  file.read(w.start + 1, tg_len, targets);
  std::fill(targets + tg_len, targets + seq_len, kIgnoredTarget);
  std::fill(targets, targets + std::min(w.first_scored, seq_len), kIgnoredTarget);
}

}  // namespace

// --- prefetching -------------------------------------------------------------------

class TokenBatchSource::Prefetcher {
 public:
  Prefetcher(const TokenBatchSource& source, int64_t depth, int64_t position)
      : source_(source), depth_(static_cast<std::size_t>(depth)), next_(position) {
    thread_ = std::thread([this] { run(); });
  }
  ~Prefetcher() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }

  Batch take(int64_t position) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return !ready_.empty() || error_; });
    if (ready_.empty()) std::rethrow_exception(error_);
    auto item = std::move(ready_.front());
    ready_.pop_front();
    changed_.notify_all();
    if (item.first != position)
      throw std::logic_error("prefetcher returned batch " + std::to_string(item.first) + " for position " +
                             std::to_string(position));
    return std::move(item.second);
  }

  void seek(int64_t position) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++generation_;
    ready_.clear();
    next_ = position;
    error_ = nullptr;
    changed_.notify_all();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      if (ready_.size() >= depth_ || error_) {
        changed_.wait(lock);
        continue;
      }
      const int64_t n = next_;
      const uint64_t generation = generation_;
      lock.unlock();
      Batch batch;
      std::exception_ptr error;
      try {
        batch = source_.train_batch(n);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      if (generation != generation_) continue;  // a seek happened meanwhile: drop it
      if (error) {
        error_ = error;
      } else {
        ready_.emplace_back(n, std::move(batch));
        next_ = n + 1;
      }
      changed_.notify_all();
    }
  }

  const TokenBatchSource& source_;
  const std::size_t depth_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::pair<int64_t, Batch>> ready_;
  int64_t next_;
  uint64_t generation_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

// --- the source ----------------------------------------------------------------------

TokenBatchSource::TokenBatchSource(const DataConfig& config, int64_t seed, int rank, int world_size, TokenFolder folder)
    : config_(config), seed_(static_cast<uint64_t>(seed)), rank_(rank), world_size_(world_size) {
  check_batch_split(config.batch_size, rank, world_size);
  if (config.seq_len < 1) throw std::invalid_argument("data.seq_len must be >= 1, got " + std::to_string(config.seq_len));
  if (config.prefetch < 0) throw std::invalid_argument("data.prefetch must be >= 0, got " + std::to_string(config.prefetch));
  if (config_.eval_stride == 0) config_.eval_stride = config.seq_len;
  if (config_.eval_stride < 0 || config_.eval_stride > config.seq_len)
    throw std::invalid_argument("data.eval_stride must be in [0, seq_len=" + std::to_string(config.seq_len) + "], got " +
                                std::to_string(config.eval_stride));
  rows_ = config.batch_size / world_size;
  std::optional<TokenFile> train;
  if (folder == TokenFolder::Training || fs::exists(split_path(config.dir, "train")))
    train.emplace(open_split(config.dir, "train"));
  auto files = std::make_shared<Files>(
      Files{config.dir, std::move(train), open_split(config.dir, "valid"), open_split(config.dir, "test")});
  const TokenFile& reference = files->reference();
  const std::string reference_name = fs::path(reference.path()).filename().string();
  for (const TokenFile* other : {&files->valid, &files->test}) {
    if (other->vocab_size() != reference.vocab_size())
      throw std::runtime_error("token file " + other->path() + ": vocab_size at offset 24: expected " +
                               std::to_string(reference.vocab_size()) + " (as " + reference_name + "), got " +
                               std::to_string(other->vocab_size()));
    if (other->tokenizer_checksum() != reference.tokenizer_checksum())
      throw std::runtime_error("token file " + other->path() + ": tokenizer checksum at offset 32 differs from " +
                               reference_name + "'s (the splits were encoded with different tokenizers)");
  }
  if (files->train && files->train->size() < config.seq_len + 1)
    throw std::runtime_error("token file " + files->train->path() + " has " + std::to_string(files->train->size()) +
                             " tokens, fewer than data.seq_len + 1 = " + std::to_string(config.seq_len + 1));
  token_bytes_ = read_token_bytes(config.dir, reference.tokenizer_checksum());
  const auto meta_path = (fs::path(config.dir) / "meta.json").string();
  if (fs::exists(meta_path)) {
    nlohmann::json meta;
    try {
      std::ifstream in(meta_path);
      meta = nlohmann::json::parse(in);
      for (const Split split : {Split::Train, Split::Valid, Split::Test})
        if (split != Split::Train || files->train)
          words_[static_cast<int>(split)] = read_split_words(meta, split_name(split).c_str(), files->get(split));
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(meta_path + ": " + e.what());
    }
  }
  files_ = std::move(files);
}

TokenBatchSource::~TokenBatchSource() = default;

int64_t TokenBatchSource::vocab_size() const { return files_->reference().vocab_size(); }
uint64_t TokenBatchSource::tokenizer_checksum() const { return files_->reference().tokenizer_checksum(); }
std::optional<int64_t> TokenBatchSource::split_words(Split split) const { return words_[static_cast<int>(split)]; }

std::vector<uint8_t> TokenBatchSource::targets_in_training() const {
  const TokenFile& file = files_->training();
  std::vector<uint8_t> seen(static_cast<std::size_t>(vocab_size()), 0);
  std::vector<int32_t> chunk(1 << 20);
  // Targets are tokens 1..N-1 (token 0 is only ever an input).
  for (int64_t start = 1; start < file.size(); start += static_cast<int64_t>(chunk.size())) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(chunk.size()), file.size() - start);
    file.read(start, n, chunk.data());
    for (int64_t i = 0; i < n; ++i) seen[static_cast<std::size_t>(chunk[static_cast<std::size_t>(i)])] = 1;
  }
  return seen;
}

Batch TokenBatchSource::train_batch(int64_t n) const {
  const int64_t L = config_.seq_len;
  const TokenFile& file = files_->training();
  const int64_t max_start = file.size() - L - 1;
  auto inputs = at::empty({rows_, L}, at::kLong);
  auto targets = at::empty({rows_, L}, at::kLong);
  auto* in = inputs.data_ptr<int64_t>();
  auto* tg = targets.data_ptr<int64_t>();
  for (int64_t i = 0; i < rows_; ++i) {
    const int64_t start =
        train_window_start(seed_, training_sequence(n, config_.batch_size, rank_ * rows_ + i), max_start);
    file.read(start, L, in + i * L);
    file.read(start + 1, L, tg + i * L);
  }
  return {inputs, targets};
}

Batch TokenBatchSource::next_train() {
  if (config_.prefetch == 0) return train_batch(position_++);
  if (!prefetcher_) prefetcher_ = std::make_unique<Prefetcher>(*this, config_.prefetch, position_);
  Batch batch = prefetcher_->take(position_);
  ++position_;
  return batch;
}

void TokenBatchSource::seek_train(int64_t position) {
  if (position < 0) throw std::invalid_argument("seek_train: negative position " + std::to_string(position));
  position_ = position;
  if (prefetcher_) prefetcher_->seek(position);
}

std::vector<Batch> TokenBatchSource::eval_batches(Split split, int64_t max_batches) {
  const TokenFile& file = files_->get(split);
  const int64_t L = config_.seq_len;
  const auto windows = eval_windows(file.size(), L, config_.eval_stride);
  const auto total = static_cast<int64_t>(windows.size());
  const int64_t B = config_.batch_size;
  int64_t batches = (total + B - 1) / B;
  if (max_batches > 0) batches = std::min(batches, max_batches);
  std::vector<Batch> out;
  out.reserve(static_cast<std::size_t>(batches));
  for (int64_t b = 0; b < batches; ++b) {
    const int64_t first = b * B;
    const int64_t n = std::min(B, total - first);
    // Full batches: B/W rows per rank. The partial last one: ceil(n/W) rows per
    // rank (all of it when W = 1), padded rows score nothing.
    const int64_t rows = n == B ? rows_ : (n + world_size_ - 1) / world_size_;
    auto inputs = at::empty({rows, L}, at::kLong);
    auto targets = at::empty({rows, L}, at::kLong);
    auto* in = inputs.data_ptr<int64_t>();
    auto* tg = targets.data_ptr<int64_t>();
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t w = rank_ * rows + i;
      if (w < n) {
        fill_eval_row(file, windows[static_cast<std::size_t>(first + w)], L, in + i * L, tg + i * L);
      } else {
        std::fill(in + i * L, in + (i + 1) * L, 0);
        std::fill(tg + i * L, tg + (i + 1) * L, kIgnoredTarget);
      }
    }
    out.push_back({inputs, targets});
  }
  return out;
}

std::string data_fingerprint(const DataConfig& data) {
  if (data.kind != DataKind::Tokens) return "";
  const TokenFile train = open_split(data.dir, "train");
  std::string fingerprint =
      "tokenizer " + checksum_hex(train.tokenizer_checksum()) + ", train.bin " + std::to_string(train.size()) + " tokens";
  for (const char* split : {"valid", "test"})
    fingerprint += std::string(", ") + split + ".bin " + std::to_string(open_split(data.dir, split).size()) + " tokens";
  return fingerprint;
}

namespace {

// Runs of builds before the evaluation splits were fingerprinted recorded
// "tokenizer T, train.bin N tokens": they agree with a folder whose record starts so.
bool same_data(const std::string& recorded, const std::string& now) {
  if (recorded == now) return true;
  const bool train_only = recorded.find(", valid.bin ") == std::string::npos;
  return train_only && now.rfind(recorded + ", valid.bin ", 0) == 0;
}

}  // namespace

void check_data_fingerprint(const std::string& recorded, const DataConfig& data) {
  // No training split there, nothing to disagree: a command that reads the
  // data then says which file is missing, and one that needs none (generate
  // --ids) runs.
  if (recorded.empty() || !fs::exists(split_path(data.dir, "train"))) return;
  const std::string now = data_fingerprint(data);
  if (!same_data(recorded, now))
    throw std::runtime_error("data.dir " + data.dir + " holds other data than the run trained on (now " + now +
                             "; the run's: " + recorded +
                             "); run from the folder the run was started in (a relative data.dir is read from the "
                             "current folder) or restore its token files");
}

std::optional<std::string> data_tokenizer_path(const DataConfig& data) {
  if (data.kind != DataKind::Tokens) return std::nullopt;
  const auto path = (fs::path(data.dir) / "tokenizer.model").string();
  const TokenFile train = open_split(data.dir, "train");
  if (!fs::exists(path))
    throw std::runtime_error(path + " is missing: the run's token files have no tokenizer to turn ids into text");
  if (const uint64_t actual = file_checksum(path); actual != train.tokenizer_checksum())
    throw std::runtime_error(path + ": checksum " + checksum_hex(actual) + " differs from " + train.path() +
                             "'s tokenizer checksum " + checksum_hex(train.tokenizer_checksum()));
  return path;
}

}  // namespace cqk
