// `cqk data tokenizer` and `cqk data encode`: the sentencepiece model and the
// token files the `tokens` batch source reads.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "cqk/log.h"
#include "cqk/runtime.h"
#include "cqk/text_corpus.h"
#include "cqk/token_file.h"
#include "cqk/tokenizer.h"

namespace cqk::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string human(double value) {
  char text[32];
  if (value >= 1e9) std::snprintf(text, sizeof(text), "%.2fG", value / 1e9);
  else if (value >= 1e6) std::snprintf(text, sizeof(text), "%.2fM", value / 1e6);
  else if (value >= 1e3) std::snprintf(text, sizeof(text), "%.1fk", value / 1e3);
  else std::snprintf(text, sizeof(text), "%.0f", value);
  return text;
}

std::string hex64(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof(text), "0x%016llx", static_cast<unsigned long long>(value));
  return text;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Errors become one line on stderr and exit status 1.
std::function<void()> guarded(const std::string& name, std::function<void()> body) {
  return [name, body = std::move(body)] {
    try {
      body();
    } catch (const CLI::Error&) {
      throw;
    } catch (const std::exception& e) {
      log::error(name + ": " + e.what());
      throw CLI::RuntimeError(1);
    }
  };
}

struct SplitStats {
  int64_t lines = 0;
  int64_t tokens = 0;
  double seconds = 0;
};

// Encodes one text file into a token file: lines are read in blocks, each block
// is cut into one contiguous range per thread and the results written in order.
SplitStats encode_file(const Tokenizer& tokenizer, const std::string& input, const std::string& output,
                       const std::string& label, int jobs) {
  constexpr std::size_t kBlockLines = 1 << 16;
  const auto start = Clock::now();
  auto last_report = start;
  LineReader reader(input);
  TokenFileWriter writer(output, static_cast<uint64_t>(tokenizer.vocab_size()), tokenizer.checksum());
  const int newline = tokenizer.newline_id();
  std::vector<std::string> block;
  std::vector<std::vector<int32_t>> pieces(static_cast<std::size_t>(jobs));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(jobs));
  SplitStats stats;
  std::string line;
  for (bool more = true; more;) {
    block.clear();
    while (block.size() < kBlockLines && (more = reader.next(line))) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      block.push_back(line);
    }
    if (block.empty()) break;
    const std::size_t per = (block.size() + static_cast<std::size_t>(jobs) - 1) / static_cast<std::size_t>(jobs);
    auto work = [&](std::size_t t) {
      try {
        auto& out = pieces[t];
        out.clear();
        const std::size_t lo = std::min(block.size(), t * per), hi = std::min(block.size(), lo + per);
        for (std::size_t i = lo; i < hi; ++i) {
          const auto ids = tokenizer.encode(block[i]);
          out.insert(out.end(), ids.begin(), ids.end());
          out.push_back(newline);
        }
      } catch (...) {
        errors[t] = std::current_exception();
      }
    };
    std::vector<std::thread> threads;
    for (std::size_t t = 1; t < static_cast<std::size_t>(jobs); ++t) threads.emplace_back(work, t);
    work(0);
    for (auto& thread : threads) thread.join();
    for (const auto& error : errors)
      if (error) std::rethrow_exception(error);
    for (const auto& out : pieces) writer.append(out);
    stats.lines += static_cast<int64_t>(block.size());
    if (seconds_since(last_report) >= 2.0) {
      last_report = Clock::now();
      const double elapsed = seconds_since(start);
      const double done = reader.file_size() > 0 ? 100.0 * static_cast<double>(reader.bytes_read()) /
                                                       static_cast<double>(reader.file_size())
                                                 : 0.0;
      char pct[16];
      std::snprintf(pct, sizeof(pct), "%.0f%%", done);
      log::info("encode " + label + ": " + pct + ", " + human(static_cast<double>(stats.lines)) + " lines, " +
                human(static_cast<double>(writer.count())) + " tokens, " +
                human(static_cast<double>(stats.lines) / elapsed) + " lines/s");
    }
  }
  stats.tokens = static_cast<int64_t>(writer.count());
  writer.finish();
  stats.seconds = seconds_since(start);
  const double secs = std::max(stats.seconds, 1e-9);
  log::info("encode " + label + ": " + std::to_string(stats.lines) + " lines -> " + std::to_string(stats.tokens) +
            " tokens in " + std::to_string(stats.seconds).substr(0, 6) + " s (" +
            human(static_cast<double>(stats.lines) / secs) + " lines/s, " +
            human(static_cast<double>(stats.tokens) / secs) + " tokens/s) -> " + output);
  return stats;
}

void run_encode(const std::string& input, const std::string& tokenizer_path, const std::string& out_dir, int jobs) {
  const TextCorpus corpus = detect_corpus(input);
  const Tokenizer tokenizer(tokenizer_path);
  if (jobs <= 0) jobs = available_cpus();
  log::info("encode: " + corpus.format + " corpus in " + corpus.dir + ", tokenizer " + tokenizer_path + " (" +
            std::to_string(tokenizer.vocab_size()) + " pieces), " + std::to_string(jobs) + " threads");
  fs::create_directories(out_dir);
  nlohmann::json meta = {{"format", corpus.format},
                         {"source", fs::absolute(corpus.dir).string()},
                         {"tokenizer", fs::absolute(tokenizer_path).string()},
                         {"tokenizer_checksum", hex64(tokenizer.checksum())},  // FNV-1a 64 of the .model
                         {"vocab_size", tokenizer.vocab_size()},
                         {"newline_id", tokenizer.newline_id()}};
  const auto start = Clock::now();
  int64_t total = 0;
  for (const char* split : kCorpusSplits) {
    const auto output = (fs::path(out_dir) / (std::string(split) + ".bin")).string();
    const auto stats = encode_file(tokenizer, corpus.split(split), output, split, jobs);
    meta["splits"][split] = {{"file", corpus.split(split)}, {"lines", stats.lines}, {"tokens", stats.tokens}};
    total += stats.tokens;
  }
  // The tokenizer travels with its token files (for decoding, generation).
  const auto copy = fs::path(out_dir) / "tokenizer.model";
  std::error_code ec;
  if (!fs::equivalent(tokenizer_path, copy, ec)) fs::copy_file(tokenizer_path, copy, fs::copy_options::overwrite_existing);
  std::ofstream(fs::path(out_dir) / "meta.json") << meta.dump(2) << "\n";
  log::info("encode: " + std::to_string(total) + " tokens in " + std::to_string(seconds_since(start)).substr(0, 6) +
            " s -> " + out_dir);
}

}  // namespace

void add_data_command(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Tokenizer and token files for data.kind: tokens");
  data->require_subcommand(1);

  struct TokenizerArgs {
    std::vector<std::string> inputs;
    int vocab_size = 32000;
    std::string out;
    int64_t max_sentences = 2000000;
    int threads = 0;
    bool verbose = false;
  };
  auto targs = std::make_shared<TokenizerArgs>();
  auto* tok = data->add_subcommand("tokenizer", "Train a sentencepiece BPE tokenizer (byte fallback)");
  tok->add_option("--input,--train", targs->inputs,
                  "A corpus folder (its training split is used) or text files")
      ->required();
  tok->add_option("--vocab-size", targs->vocab_size, "Vocabulary size")->capture_default_str();
  tok->add_option("--out", targs->out, "Model file to write (PATH.model; PATH.vocab is written too)")->required();
  tok->add_option("--max-sentences", targs->max_sentences, "Lines sampled for training (0: all)")->capture_default_str();
  tok->add_option("--jobs", targs->threads, "Trainer threads (default: all available cores)");
  tok->add_flag("--verbose", targs->verbose, "Show sentencepiece's own log");
  tok->callback(guarded("cqk data tokenizer", [targs] {
    TokenizerTrainOptions options;
    options.inputs = tokenizer_inputs(targs->inputs);
    options.vocab_size = targs->vocab_size;
    options.model_path = targs->out;
    options.max_sentences = targs->max_sentences;
    options.threads = targs->threads;
    options.verbose = targs->verbose;
    const auto parent = fs::path(targs->out).parent_path();
    if (!parent.empty()) fs::create_directories(parent);
    const auto start = Clock::now();
    train_tokenizer(options);
    log::info("tokenizer: " + std::to_string(seconds_since(start)).substr(0, 6) + " s, checksum " +
              hex64(file_checksum(targs->out)));
  }));

  struct EncodeArgs {
    std::string input, tokenizer, out;
    int jobs = 0;
  };
  auto eargs = std::make_shared<EncodeArgs>();
  auto* enc = data->add_subcommand("encode", "Encode a corpus folder into train.bin, valid.bin, test.bin");
  enc->add_option("--input", eargs->input,
                  "Corpus folder: wiki.{train,valid,test}.tokens, wiki.{train,valid,test}.raw or {train,valid,test}.txt")
      ->required();
  enc->add_option("--tokenizer", eargs->tokenizer, "Tokenizer model from `cqk data tokenizer`")->required();
  enc->add_option("--out", eargs->out, "Output folder (data.dir)")->required();
  enc->add_option("--jobs", eargs->jobs, "Encoding threads (default: all available cores)");
  enc->callback(guarded("cqk data encode", [eargs] { run_encode(eargs->input, eargs->tokenizer, eargs->out, eargs->jobs); }));
}

}  // namespace cqk::cli
