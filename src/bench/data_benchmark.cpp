#include "bench/data_benchmark.h"

#include <nlohmann/json.hpp>
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "bench/benchmark.h"
#include "cqk/log.h"
#include "cqk/runtime.h"
#include "cqk/text_corpus.h"
#include "cqk/token_loader.h"

namespace cqk {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// The folder the benchmark writes into; a temporary one is removed with everything in it.
class WorkDir {
 public:
  explicit WorkDir(const std::string& requested) {
    if (!requested.empty()) {
      fs::create_directories(requested);
      path_ = requested;
      return;
    }
    std::string pattern = (fs::temp_directory_path() / "cqk-bench-data-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("cannot create a temporary folder " + pattern);
    path_ = pattern;
    temporary_ = true;
  }
  ~WorkDir() {
    std::error_code ec;
    if (temporary_) fs::remove_all(path_, ec);
  }
  WorkDir(const WorkDir&) = delete;
  WorkDir& operator=(const WorkDir&) = delete;
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
  bool temporary_ = false;
};

TextCorpus corpus_of(const std::string& input) {
  if (fs::is_directory(input)) return detect_corpus(input);
  if (!fs::is_regular_file(input)) throw std::invalid_argument(input + ": no such corpus folder or text file");
  TextCorpus file;
  file.format = "file";
  file.train = file.valid = file.test = input;
  return file;
}

// Training-split tokens per second served by next_train() over `batches` batches.
double loader_rate(const DataConfig& data, int64_t batches) {
  TokenBatchSource source(data, /*seed=*/1);
  source.next_train();  // opens the maps and starts the prefetch thread before the clock
  const auto start = Clock::now();
  for (int64_t i = 0; i < batches; ++i) source.next_train();
  return static_cast<double>(batches * data.batch_size * data.seq_len) / std::max(seconds_since(start), 1e-12);
}

void check(const DataBenchOptions& o) {
  if (o.input.empty()) throw std::invalid_argument("--input: a corpus folder or a text file is required");
  if (o.tokenizer.empty() && o.vocab_size < 2) throw std::invalid_argument("--vocab-size must be >= 2");
  if (o.seq_len < 1 || o.batch_size < 1 || o.batches < 1)
    throw std::invalid_argument("--seq-len, --batch-size and --batches must be >= 1");
  if (o.prefetch < 1) throw std::invalid_argument("--prefetch must be >= 1 (the second measurement runs without)");
  if (o.training && o.training_steps < 1) throw std::invalid_argument("--train-steps must be >= 1");
}

}  // namespace

DataBenchResult benchmark_data(const DataBenchOptions& options) {
  check(options);
  DataBenchResult r;
  const TextCorpus corpus = corpus_of(options.input);
  r.input = options.input;
  r.format = corpus.format;
  r.jobs = options.jobs > 0 ? options.jobs : available_cpus();
  const WorkDir work(options.work_dir);

  std::string tokenizer_path = options.tokenizer;
  if (tokenizer_path.empty()) {
    TokenizerTrainOptions train;
    train.inputs = {corpus.train};
    train.vocab_size = options.vocab_size;
    train.model_path = work / "tokenizer.model";
    train.threads = r.jobs;
    log::info("bench data: training a " + std::to_string(options.vocab_size) + "-piece tokenizer on " + corpus.train);
    const auto start = Clock::now();
    train_tokenizer(train);
    r.tokenizer_seconds = seconds_since(start);
    tokenizer_path = train.model_path;
  }
  const Tokenizer tokenizer(tokenizer_path);
  r.vocab_size = tokenizer.vocab_size();

  const std::string tokens_dir = work / "tokens";
  r.encode = encode_corpus(corpus, tokenizer, tokens_dir, r.jobs);
  const double encode_seconds = std::max(r.encode.seconds, 1e-12);
  r.encode_tokens_per_s = static_cast<double>(r.encode.tokens) / encode_seconds;
  r.encode_bytes_per_s = static_cast<double>(r.encode.bytes) / encode_seconds;

  DataConfig data;
  data.kind = DataKind::Tokens;
  data.dir = tokens_dir;
  data.seq_len = options.seq_len;
  data.batch_size = options.batch_size;
  r.seq_len = options.seq_len;
  r.batch_size = options.batch_size;
  r.batches = options.batches;
  r.prefetch = data.prefetch = options.prefetch;
  r.loader_tokens_per_s = loader_rate(data, options.batches);
  data.prefetch = 0;
  r.loader_tokens_per_s_without_prefetch = loader_rate(data, options.batches);

  if (options.training) {
    BenchOptions bench;
    bench.warmup = 2;
    bench.steps = options.training_steps;
    const BenchResult training = benchmark_training(*options.training, bench);
    r.training_name = training.name;
    r.training_tokens_per_s = training.tokens_per_s;
    r.loader_over_training = r.loader_tokens_per_s / std::max(training.tokens_per_s, 1e-12);
  }
  return r;
}

std::string to_json(const DataBenchResult& r) {
  const auto optional = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
  return json{{"input", r.input},
              {"format", r.format},
              {"jobs", r.jobs},
              {"vocab_size", r.vocab_size},
              {"tokenizer_seconds", optional(r.tokenizer_seconds)},
              {"encode",
               {{"lines", r.encode.lines},
                {"tokens", r.encode.tokens},
                {"bytes", r.encode.bytes},
                {"seconds", r.encode.seconds},
                {"tokens_per_s", r.encode_tokens_per_s},
                {"bytes_per_s", r.encode_bytes_per_s}}},
              {"loader",
               {{"seq_len", r.seq_len},
                {"batch_size", r.batch_size},
                {"batches", r.batches},
                {"prefetch", r.prefetch},
                {"tokens_per_s", r.loader_tokens_per_s},
                {"tokens_per_s_without_prefetch", r.loader_tokens_per_s_without_prefetch}}},
              {"training",
               {{"name", r.training_name},
                {"tokens_per_s", optional(r.training_tokens_per_s)},
                {"loader_over_training", optional(r.loader_over_training)}}}}
      .dump();
}

std::string describe(const DataBenchResult& r) {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "input       %s (%s): %.2f MB, %lld lines\n", r.input.c_str(), r.format.c_str(),
                static_cast<double>(r.encode.bytes) / 1e6, static_cast<long long>(r.encode.lines));
  out << line;
  if (r.tokenizer_seconds)
    std::snprintf(line, sizeof line, "tokenizer   trained, %d pieces, in %.2f s (%d threads)\n", r.vocab_size,
                  *r.tokenizer_seconds, r.jobs);
  else
    std::snprintf(line, sizeof line, "tokenizer   given, %d pieces\n", r.vocab_size);
  out << line;
  std::snprintf(line, sizeof line, "encoding    %lld tokens in %.2f s: %.0f tokens/s, %.2f MB/s (%d threads)\n",
                static_cast<long long>(r.encode.tokens), r.encode.seconds, r.encode_tokens_per_s,
                r.encode_bytes_per_s / 1e6, r.jobs);
  out << line;
  std::snprintf(line, sizeof line,
                "loader      %lld batches of %lld x %lld: %.3g tokens/s with prefetch %lld, %.3g without\n",
                static_cast<long long>(r.batches), static_cast<long long>(r.batch_size),
                static_cast<long long>(r.seq_len), r.loader_tokens_per_s, static_cast<long long>(r.prefetch),
                r.loader_tokens_per_s_without_prefetch);
  out << line;
  if (r.training_tokens_per_s) {
    std::snprintf(line, sizeof line, "training    %s: %.0f tokens/s -> the loader serves %.0fx that\n",
                  r.training_name.c_str(), *r.training_tokens_per_s, r.loader_over_training.value_or(0));
    out << line;
  }
  return out.str();
}

}  // namespace cqk
