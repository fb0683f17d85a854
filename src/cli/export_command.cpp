// `cqk export RUN_DIR_OR_CHECKPOINT --out DIR`: the trained model as a Hugging
// Face model folder (hf_export.h): safetensors weights, config.json, the model
// code and the run's tokenizer, loadable by transformers with trust_remote_code.
#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "cqk/hf_export.h"
#include "cqk/token_loader.h"
#include "cqk/trained_model.h"

namespace cqk::cli {

void add_export_command(CLI::App& app) {
  struct Arguments {
    std::string target;
    std::string out;
  };
  auto args = std::make_shared<Arguments>();
  auto* command = app.add_subcommand("export", "Write a trained model as a Hugging Face model folder (AutoModelForCausalLM, AutoTokenizer)");
  command->add_option("target", args->target, "Run directory, or a checkpoint file RUN_DIR/checkpoints/step-*.ckpt")
      ->required()
      ->type_name("RUN_DIR_OR_CHECKPOINT");
  command->add_option("--out", args->out, "The folder to write (new, or empty)")->required()->type_name("DIR");
  command->callback([args] {
    auto trained = load_trained_model(args->target, "cpu");
    // Checked before anything is written: a run on token files must still have its tokenizer.
    const auto tokenizer = data_tokenizer_path(trained.config.data);
    export_hf(trained.model, trained.config, tokenizer, {trained.run_dir, trained.checkpoint, trained.step},
              args->out);
    std::cout << "exported " << trained.checkpoint << " (step " << trained.step << ") to " << args->out
              << (tokenizer ? " with its tokenizer" : " (a recall-task run: ids only, no tokenizer)") << "\n";
    exit_status() = 0;
  });
}

}  // namespace cqk::cli
