// `cqk data tokenizer` and `cqk data encode`: the sentencepiece model and the
// token files the `tokens` batch source reads (corpus_encoding.h does the work).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"
#include "cqk/corpus_encoding.h"
#include "cqk/log.h"
#include "cqk/runtime.h"
#include "cqk/text_corpus.h"
#include "cqk/tokenizer.h"

namespace cqk::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Errors name the subcommand; main() prints them as the tool's one
// `cqk: error:` line (exit 2), like every other command's.
std::function<void()> guarded(const std::string& name, std::function<void()> body) {
  return [name, body = std::move(body)] {
    try {
      body();
    } catch (const CLI::Error&) {
      throw;
    } catch (const std::exception& e) {
      throw std::runtime_error(name + ": " + e.what());
    }
  };
}

void run_encode(const std::string& input, const std::string& tokenizer_path, const std::string& out_dir, int jobs) {
  std::error_code ec;
  const TextCorpus corpus = fs::is_regular_file(input, ec) ? evaluation_corpus(input) : detect_corpus(input);
  const Tokenizer tokenizer(tokenizer_path);
  if (jobs <= 0) jobs = available_cpus();
  log::info("encode: " + corpus.format + " corpus " + (corpus.dir.empty() ? corpus.valid : corpus.dir) +
            ", tokenizer " + tokenizer_path + " (" +
            std::to_string(tokenizer.vocab_size()) + " pieces), " + std::to_string(jobs) + " threads");
  const auto start = Clock::now();
  const EncodeStats total = encode_corpus(corpus, tokenizer, out_dir, jobs);
  log::info("encode: " + std::to_string(total.tokens) + " tokens in " + std::to_string(seconds_since(start)).substr(0, 6) +
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
  tok->add_option("--max-sentences", targs->max_sentences, "Lines sampled for training (0: all)")
      ->capture_default_str()
      ->check(non_negative_number());
  tok->add_option("--jobs", targs->threads, "Trainer threads (default: all available cores)")->check(positive_number());
  tok->add_flag("--verbose", targs->verbose, "Show sentencepiece's own log");
  tok->callback(guarded("data tokenizer", [targs] {
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
              checksum_hex(file_checksum(targs->out)));
  }));

  struct EncodeArgs {
    std::string input, tokenizer, out;
    int jobs = 0;
  };
  auto eargs = std::make_shared<EncodeArgs>();
  auto* enc = data->add_subcommand(
      "encode", "Encode a corpus folder into train.bin, valid.bin, test.bin (a single text file: valid.bin, test.bin)");
  enc->add_option("--input", eargs->input,
                  "Corpus folder: wiki.{train,valid,test}.tokens, wiki.{train,valid,test}.raw or "
                  "{train,valid,test}.txt; or one text file, written as the valid and test splits of an "
                  "evaluation-only folder (no train.bin) for `cqk eval RUN --data OUT`")
      ->required();
  enc->add_option("--tokenizer", eargs->tokenizer, "Tokenizer model from `cqk data tokenizer`")->required();
  enc->add_option("--out", eargs->out, "Output folder (data.dir)")->required();
  enc->add_option("--jobs", eargs->jobs, "Encoding threads (default: all available cores)")->check(positive_number());
  enc->callback(guarded("data encode", [eargs] { run_encode(eargs->input, eargs->tokenizer, eargs->out, eargs->jobs); }));
}

}  // namespace cqk::cli
