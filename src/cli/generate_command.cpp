// `cqk generate RUN_DIR_OR_CHECKPOINT --prompt "1 2 3"`: samples a continuation
// of token ids from a trained checkpoint. Ids, not text: the tokenizer lives in
// the torch-free support library and runs do not record which one they used.
// Each step runs the whole context (no KV cache), cut to the last data.seq_len tokens.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"
#include "cqk/config.h"
#include "cqk/model.h"
#include "cqk/sampling.h"
#include "trained_model.h"

namespace cqk::cli {

namespace {

// "1 2 3" (spaces or commas) -> ids, each in [0, vocab).
std::vector<int64_t> parse_prompt(const std::string& text, int64_t vocab) {
  std::string spaced = text;
  for (char& c : spaced)
    if (c == ',') c = ' ';
  std::istringstream in(spaced);
  std::vector<int64_t> ids;
  for (std::string word; in >> word;) {
    std::size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size())
      throw std::invalid_argument("--prompt: '" + word + "' is not a token id (expected integers like \"1 2 3\")");
    if (id < 0 || id >= vocab)
      throw std::invalid_argument("--prompt: token id " + word + " is outside the vocabulary [0, " +
                                  std::to_string(vocab) + ")");
    ids.push_back(id);
  }
  if (ids.empty()) throw std::invalid_argument("--prompt: expected at least one token id");
  return ids;
}

}  // namespace

void add_generate_command(CLI::App& app) {
  struct Arguments {
    std::string target;
    std::string prompt;
    int64_t tokens = 20;
    SamplingOptions sampling;
    uint64_t seed = 0;
    std::string device;
  };
  auto args = std::make_shared<Arguments>();
  auto* generate = app.add_subcommand("generate", "Sample a continuation of token ids from a trained run");
  generate->add_option("target", args->target, "Run directory, or a checkpoint file RUN_DIR/checkpoints/step-*.ckpt")
      ->required()
      ->type_name("RUN_DIR_OR_CHECKPOINT");
  generate->add_option("--prompt", args->prompt, "Space-separated token ids, e.g. \"1 2 3\"")
      ->required()
      ->type_name("IDS");
  generate->add_option("--tokens", args->tokens, "Tokens to generate")->check(CLI::NonNegativeNumber);
  generate->add_option("--temperature", args->sampling.temperature, "Softmax temperature; 0: greedy")
      ->check(CLI::NonNegativeNumber);
  generate->add_option("--top-k", args->sampling.top_k, "Sample among the k most likely tokens; 0: all")
      ->check(CLI::NonNegativeNumber);
  generate->add_option("--seed", args->seed, "Seed of the sampler");
  generate->add_option("--device", args->device, "auto|cpu|cuda (default: the run's train.device)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  generate->callback([args] {
    Config config;
    std::string checkpoint;
    int64_t step = 0;
    auto model = load_trained_model(args->target, args->device, config, checkpoint, step);
    const auto device = model->parameters().front().device();
    std::vector<int64_t> ids = parse_prompt(args->prompt, config.model.vocab_size);
    const std::size_t prompt_size = ids.size();
    const auto context = static_cast<std::size_t>(config.data.seq_len);

    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(args->seed);
    at::NoGradGuard no_grad;
    for (int64_t i = 0; i < args->tokens; ++i) {
      const std::size_t start = ids.size() > context ? ids.size() - context : 0;
      const auto window = std::vector<int64_t>(ids.begin() + static_cast<std::ptrdiff_t>(start), ids.end());
      const auto inputs = at::tensor(window, at::kLong).unsqueeze(0).to(device);
      const auto logits = model->forward(inputs).select(1, -1).squeeze(0);  // [vocab]
      ids.push_back(sample_next(logits, args->sampling, generator).item<int64_t>());
    }
    std::string line;
    for (std::size_t i = prompt_size; i < ids.size(); ++i) line += (line.empty() ? "" : " ") + std::to_string(ids[i]);
    std::cout << line << "\n";
    exit_status() = 0;
  });
}

}  // namespace cqk::cli
