// `cqk eval RUN_DIR_OR_CHECKPOINT [--data DIR] [--save NAME]`: the evaluation
// metrics (evaluation.h) of a trained checkpoint on the validation or test
// split of its run's data, or of another token folder encoded with the same
// tokenizer; --save keeps them in the run folder for `cqk stats --metric NAME_bpb`.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"
#include "cqk/trained_model.h"
#include "cqk/batch_source.h"
#include "cqk/atomic_file.h"
#include "cqk/evaluation_report.h"
#include "cqk/model.h"
#include "cqk/sweep_results.h"
#include "cqk/token_loader.h"
#include "cqk/tokenizer.h"
#include "cqk/trainer.h"

namespace cqk::cli {

namespace {
// The token folder `dir` as the evaluated data of a run whose own data is
// `training`: refused unless it was encoded with the run's tokenizer (the
// model's ids would mean other text).
std::unique_ptr<BatchSource> evaluation_folder(const Config& config, const std::string& dir,
                                               const BatchSource& training) {
  if (config.data.kind != DataKind::Tokens)
    throw std::runtime_error("--data " + dir + ": the run trained on data.kind " + to_string(config.data.kind) +
                             ", not on token files");
  DataConfig data = config.data;
  data.dir = dir;
  auto source = std::make_unique<TokenBatchSource>(data, config.run.seed, 0, 1, TokenFolder::Evaluation);
  const uint64_t expected = dynamic_cast<const TokenBatchSource&>(training).tokenizer_checksum();
  if (source->tokenizer_checksum() != expected)
    throw std::runtime_error("--data " + dir + ": encoded with another tokenizer (checksum " +
                             checksum_hex(source->tokenizer_checksum()) + ", the run's data " + config.data.dir +
                             " has " + checksum_hex(expected) + "); encode it with " + config.data.dir +
                             "/tokenizer.model");
  return source;
}
}  // namespace

void add_eval_command(CLI::App& app) {
  struct Arguments {
    std::string target;
    std::string split = "valid";
    int64_t batches = 0;
    std::string device;
    std::string data;
    std::string save;
    bool json = false;
  };
  auto args = std::make_shared<Arguments>();
  auto* eval = app.add_subcommand("eval", "Evaluate a run's newest checkpoint (or a given checkpoint file)");
  eval->add_option("target", args->target, "Run directory, or a checkpoint file RUN_DIR/checkpoints/step-*.ckpt")
      ->required()
      ->type_name("RUN_DIR_OR_CHECKPOINT");
  eval->add_option("--split", args->split, "Split to evaluate")->check(CLI::IsMember({"valid", "test"}));
  eval->add_option("--batches", args->batches, "Evaluate at most this many batches (default 0: the whole split)")
      ->check(non_negative_number());
  eval->add_option("--device", args->device, "auto|cpu|cuda (default: the run's train.device)")
      ->check(CLI::IsMember(kind_names<kDeviceChoiceNames>()));
  eval->add_option("--data", args->data,
                   "Evaluate on this token folder instead of the run's data.dir. It must be encoded with the run's "
                   "tokenizer (`cqk data encode --tokenizer RUN_DATA/tokenizer.model`; a single text file as --input "
                   "makes an evaluation-only folder). Seen/unseen targets stay those of the run's training split")
      ->type_name("DIR");
  eval->add_option("--save", args->save,
                   "Also write the evaluation to RUN_DIR/evals/NAME.json (replacing one of that name), where `cqk "
                   "stats` finds it as the metrics NAME_ppl, NAME_bpb, NAME_word_ppl, NAME_seen_loss and NAME_error "
                   "of the run's final step; save one NAME from one folder and split for every run")
      ->type_name("NAME")
      ->check(option_check(sweep::check_evaluation_name));
  eval->add_flag("--json", args->json, "Print one JSON object instead of a line of text");
  eval->callback([args] {
    // A saved evaluation stands for the split in `cqk stats`: a part of it would compare unlike with like.
    if (!args->save.empty() && args->batches > 0)
      throw std::runtime_error("--save needs the whole split: leave --batches out");
    auto trained = load_trained_model(args->target, args->device);
    auto& [model, config, run_dir, checkpoint, step] = trained;
    const auto device = model->parameters().front().device();
    const Split split = args->split == "test" ? Split::Test : Split::Valid;
    // The run's own data: its training split decides which targets count as seen
    // (also with --data), so a missing one says where eval looked.
    auto training = [&] {
      try {
        return make_batch_source(config.data, config.run.seed);
      } catch (const std::exception& e) {
        throw std::runtime_error(std::string(e.what()) + "; eval reads the run's data.dir (" + run_dir +
                                 "/config.yaml), relative to the current folder: run it where the run was started");
      }
    }();
    const auto other = args->data.empty() ? nullptr : evaluation_folder(config, args->data, *training);
    BatchSource& evaluated = other ? *other : *training;
    const auto result = evaluate(model, evaluated, split, args->batches, device,
                                 TargetTables{training->targets_in_training(), evaluated.token_bytes()},
                                 "evaluating " + args->split);
    const std::string data = args->data.empty() ? config.data.dir : args->data;
    nlohmann::json line = {{"checkpoint", checkpoint}, {"step", step},          {"split", args->split},
                           {"batches", args->batches}, {"data", data}};
    line.update(evaluation_json(result));
    if (!args->save.empty()) {
      const auto file = sweep::saved_evaluation_path(run_dir, args->save);
      std::filesystem::create_directories(file.parent_path());
      write_file_atomically(file.string(), line.dump(2) + "\n");
    }
    if (args->json) {
      std::cout << line.dump() << "\n";
    } else {
      std::cout << args->split << (args->data.empty() ? "" : " of " + args->data) << ": " << describe(result) << " ("
                << checkpoint << ", step " << step << ")\n";
    }
    exit_status() = 0;
  });
}

}  // namespace cqk::cli
