// `cqk generate RUN_DIR_OR_CHECKPOINT --prompt TEXT`: samples a continuation
// from a trained checkpoint. A run on token files speaks text through its data
// folder's tokenizer (token_loader.h's data_tokenizer_path); with --ids, and for
// recall-task runs, prompt and continuation are token ids.
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
#include "cqk/safetensors.h"
#include "cqk/sampling.h"
#include "cqk/token_loader.h"
#include "cqk/tokenizer.h"
#include "cqk/trained_model.h"

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

std::vector<int64_t> encode_prompt(const Tokenizer& tokenizer, const std::string& text) {
  const auto encoded = tokenizer.encode(text);
  if (encoded.empty()) throw std::invalid_argument("--prompt: the text encodes to no tokens");
  return {encoded.begin(), encoded.end()};
}

// The ids and the logits [T, vocab] of the prompt's last data.seq_len tokens, for
// checks against another implementation (the exported model's, say).
void save_prompt_logits(const std::string& path, TransformerLM& model, const std::vector<int64_t>& prompt,
                        std::size_t context) {
  const std::size_t start = prompt.size() > context ? prompt.size() - context : 0;
  const auto window = at::tensor(std::vector<int64_t>(prompt.begin() + static_cast<std::ptrdiff_t>(start), prompt.end()),
                                 at::kLong);
  const auto device = model->parameters().front().device();
  const auto logits = model->forward(window.unsqueeze(0).to(device)).squeeze(0).to(at::kFloat);
  save_safetensors(path, {{"input_ids", window}, {"logits", logits}});
}

}  // namespace

void add_generate_command(CLI::App& app) {
  struct Arguments {
    std::string target;
    std::string prompt;
    bool ids = false;
    std::string logits_out;
    int64_t tokens = 20;
    SamplingOptions sampling;
    uint64_t seed = 0;
    std::string device;
  };
  auto args = std::make_shared<Arguments>();
  auto* generate = app.add_subcommand("generate", "Sample a continuation of a prompt from a trained run");
  generate->add_option("target", args->target, "Run directory, or a checkpoint file RUN_DIR/checkpoints/step-*.ckpt")
      ->required()
      ->type_name("RUN_DIR_OR_CHECKPOINT");
  generate->add_option("--prompt", args->prompt,
                       "Text, encoded with the run's tokenizer; token ids (\"1 2 3\") with --ids or for a "
                       "recall-task run")
      ->required()
      ->type_name("TEXT");
  generate->add_flag("--ids", args->ids, "Prompt and continuation as token ids, also for a run with a tokenizer");
  generate->add_option("--logits-out", args->logits_out,
                       "Also write the prompt's ids and logits (its last data.seq_len tokens) as safetensors "
                       "(input_ids [T], logits [T, vocab])")
      ->type_name("FILE");
  generate->add_option("--tokens", args->tokens, "Tokens to generate")->check(non_negative_number());
  generate->add_option("--temperature", args->sampling.temperature, "Softmax temperature; 0: greedy")
      ->check(non_negative_number());
  generate->add_option("--top-k", args->sampling.top_k, "Sample among the k most likely tokens; 0: all")
      ->check(non_negative_number());
  generate->add_option("--seed", args->seed, "Seed of the sampler");
  generate->add_option("--device", args->device, "auto|cpu|cuda (default: the run's train.device)")
      ->check(CLI::IsMember(kind_names<kDeviceChoiceNames>()));
  generate->callback([args] {
    auto trained = load_trained_model(args->target, args->device);
    auto& model = trained.model;
    const auto& config = trained.config;
    const auto device = model->parameters().front().device();
    const auto tokenizer_path = args->ids ? std::nullopt : data_tokenizer_path(config.data);
    const auto tokenizer = tokenizer_path ? std::make_unique<Tokenizer>(*tokenizer_path) : nullptr;
    std::vector<int64_t> ids = tokenizer ? encode_prompt(*tokenizer, args->prompt)
                                         : parse_prompt(args->prompt, config.model.vocab_size);
    const std::size_t prompt_size = ids.size();
    const auto context = static_cast<std::size_t>(config.data.seq_len);
    if (!args->logits_out.empty()) save_prompt_logits(args->logits_out, model, ids, context);

    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(args->seed);
    at::NoGradGuard no_grad;
    for (int64_t i = 0; i < args->tokens; ++i) {
      const std::size_t start = ids.size() > context ? ids.size() - context : 0;
      const auto window = std::vector<int64_t>(ids.begin() + static_cast<std::ptrdiff_t>(start), ids.end());
      const auto inputs = at::tensor(window, at::kLong).unsqueeze(0).to(device);
      auto logits = model->forward(inputs).select(1, -1).squeeze(0);  // [vocab]
      // model.vocab_size may exceed the tokenizer's (padded for speed); ids past it cannot be decoded.
      if (tokenizer && logits.size(0) > tokenizer->vocab_size()) logits = logits.narrow(0, 0, tokenizer->vocab_size());
      ids.push_back(sample_next(logits, args->sampling, generator).item<int64_t>());
    }
    if (tokenizer) {
      std::cout << tokenizer->decode(std::vector<int>(ids.begin() + static_cast<std::ptrdiff_t>(prompt_size), ids.end()))
                << "\n";
    } else {
      std::string line;
      for (std::size_t i = prompt_size; i < ids.size(); ++i) line += (line.empty() ? "" : " ") + std::to_string(ids[i]);
      std::cout << line << "\n";
    }
    exit_status() = 0;
  });
}

}  // namespace cqk::cli
