#pragma once
// Data pipeline throughput, measured: what `cqk bench data` runs. Trains a
// tokenizer (unless one is given), encodes a corpus into token files, then
// draws training batches from them through TokenBatchSource with and without
// its prefetch thread, and, side by side in the same process, times training
// steps of a reference config, so the loader's rate is reported as a multiple
// of the rate at which a model consumes tokens. docs/BENCHMARKS.md has figures.
#include <cstdint>
#include <optional>
#include <string>

#include "cqk/config.h"
#include "cqk/corpus_encoding.h"

namespace cqk {

struct DataBenchOptions {
  std::string input;        // a corpus folder (detect_corpus) or one text file (used for every split)
  std::string tokenizer;    // a .model to encode with; empty: train one of vocab_size on the training split
  int vocab_size = 32000;
  int jobs = 0;             // tokenizer and encoding threads; <= 0: all available cores
  std::string work_dir;     // tokenizer and token files go here; empty: a temporary folder, removed at the end
  int64_t seq_len = 256;    // loader windows
  int64_t batch_size = 32;
  int64_t batches = 2000;   // batches drawn per loader measurement
  int64_t prefetch = 2;     // batches the prefetch thread keeps ready in the first measurement
  std::optional<Config> training;  // reference model; nullopt: no training measurement
  int64_t training_steps = 10;     // timed steps of the reference (after 2 untimed)
};

struct DataBenchResult {
  std::string input, format;    // format: detect_corpus's, or "file"
  int jobs = 0;
  int vocab_size = 0;
  std::optional<double> tokenizer_seconds;  // when trained here
  EncodeStats encode;                       // over the distinct text files encoded
  double encode_tokens_per_s = 0, encode_bytes_per_s = 0;
  int64_t seq_len = 0, batch_size = 0, batches = 0, prefetch = 0;
  // Training-split tokens served per second (batch_size * seq_len per batch,
  // as the trainer counts them), with prefetch and without.
  double loader_tokens_per_s = 0, loader_tokens_per_s_without_prefetch = 0;
  std::string training_name;
  std::optional<double> training_tokens_per_s;     // benchmark_training's median-step rate
  std::optional<double> loader_over_training;      // loader_tokens_per_s / training_tokens_per_s
};

// Throws std::invalid_argument or std::runtime_error with a one-line message on bad input.
DataBenchResult benchmark_data(const DataBenchOptions& options);

std::string to_json(const DataBenchResult& result);
std::string describe(const DataBenchResult& result);

}  // namespace cqk
