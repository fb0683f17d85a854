#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "commands.h"
#include "bench/benchmark.h"
#include "cqk/config_loader.h"
#include "bench/coupling_benchmark.h"
#include "bench/data_benchmark.h"
#include "cqk/runtime.h"

namespace cqk::cli {
namespace {

// `cqk bench data`: tokenizer training, encoding and loader throughput, with the
// loader's rate as a multiple of a reference model's training rate.
void add_bench_data_command(CLI::App& bench) {
  struct Arguments {
    DataBenchOptions options;
    std::string training_config;
    std::vector<std::string> overrides;
    bool no_training = false;
    bool json = false;
  };
  auto args = std::make_shared<Arguments>();
  auto* data = bench.add_subcommand(
      "data", "Time tokenizer training, encoding and the token loader (tokens/s), and compare the loader with training");
  data->add_option("--input", args->options.input, "Corpus folder (WikiText layout) or one text file")->required();
  auto* tokenizer =
      data->add_option("--tokenizer", args->options.tokenizer, "Encode with this .model instead of training one");
  data->add_option("--vocab-size", args->options.vocab_size, "Pieces of the tokenizer trained here")
      ->capture_default_str()
      ->check(CLI::Range(2, 1 << 24))
      ->excludes(tokenizer);
  data->add_option("--jobs", args->options.jobs, "Tokenizer and encoding threads (default: all available cores)");
  data->add_option("--work-dir", args->options.work_dir, "Keep the tokenizer and token files here (default: a "
                                                         "temporary folder, removed)");
  data->add_option("--seq-len", args->options.seq_len, "Loader window length")->capture_default_str()->check(positive_number());
  data->add_option("--batch-size", args->options.batch_size, "Loader batch size")->capture_default_str()->check(positive_number());
  data->add_option("--batches", args->options.batches, "Batches drawn per loader measurement")
      ->capture_default_str()
      ->check(positive_number());
  data->add_option("--prefetch", args->options.prefetch, "Batches the prefetch thread keeps ready")
      ->capture_default_str()
      ->check(positive_number());
  auto* train_config = data->add_option("--train-config", args->training_config,
                   "Reference model whose training tokens/s the loader is compared with (default: the embedded config)");
  auto* set = data->add_option("--set", args->overrides, "Override a key of the reference config")->type_name("KEY=VALUE");
  auto* train_steps = data->add_option("--train-steps", args->options.training_steps, "Timed training steps of the reference")
      ->capture_default_str()
      ->check(positive_number());
  auto* no_training = data->add_flag("--no-training", args->no_training, "Skip the training reference");
  data->add_flag("--json", args->json, "Print one JSON object instead of text");
  for (auto* option : {train_config, set, train_steps}) no_training->excludes(option);
  data->callback([args] {
    if (!args->no_training)
      args->options.training = args->training_config.empty() ? default_config(args->overrides)
                                                             : load_config(args->training_config, args->overrides);
    const auto result = benchmark_data(args->options);
    std::cout << (args->json ? to_json(result) + "\n" : describe(result)) << std::flush;
  });
}

// `cqk bench coupling`: the coupling's kernel path against its ATen path.
void add_bench_coupling_command(CLI::App& bench) {
  struct Arguments {
    CouplingBenchOptions options;
    std::vector<int64_t> shape;
    bool json = false;
  };
  auto args = std::make_shared<Arguments>();
  auto* coupling = bench.add_subcommand(
      "coupling", "Time the affine coupling alone, forward and forward+backward: kernel against ATen");
  coupling->add_option("--shape", args->shape, "batch,heads,time,head_dim of q and k (default 8,8,256,64)")
      ->delimiter(',')
      ->expected(4)
      ->check(positive_number());
  coupling->add_option("--hidden", args->options.hidden, "Conditioner width")->capture_default_str()->check(positive_number());
  coupling->add_option("--steps", args->options.steps, "Coupling steps")->capture_default_str()->check(positive_number());
  coupling->add_option("--device", args->options.device, "cpu or cuda[:N]")->capture_default_str();
  coupling->add_option("--dtype", args->options.dtype, "fp32 or bf16")->capture_default_str();
  coupling->add_option("--repeats", args->options.repeats, "Timed repetitions per path and round")
      ->capture_default_str()
      ->check(positive_number());
  coupling->add_option("--rounds", args->options.rounds, "Alternations of the two paths")
      ->capture_default_str()
      ->check(positive_number());
  coupling->add_flag("--json", args->json, "Print one JSON object instead of text");
  coupling->callback([args] {
    auto& o = args->options;
    if (!args->shape.empty()) std::tie(o.batch, o.heads, o.time, o.head_dim) =
        std::tuple(args->shape[0], args->shape[1], args->shape[2], args->shape[3]);
    configure_threads();  // cqk --threads N, $CQK_NUM_THREADS, or all cores
    const auto result = benchmark_coupling(o);
    std::cout << (args->json ? to_json(result) + "\n" : describe(result)) << std::flush;
  });
}

}  // namespace

void add_bench_command(CLI::App& app) {
  struct Arguments {
    std::string config_path, compare_path;
    std::vector<std::string> overrides;
    BenchOptions options;
    bool json = false;
    bool profile = false;
  };
  auto args = std::make_shared<Arguments>();
  auto* bench = app.add_subcommand("bench", "Measure throughput (docs/BENCHMARKS.md)");
  bench->require_subcommand(1);
  auto* train = bench->add_subcommand(
      "train", "Time training steps of a config: tokens/s, step time, peak memory, FLOPs per token, MFU");
  train->add_option("config", args->config_path, "YAML config file; omitted: the embedded configs/default.yaml");
  train->add_option("--set", args->overrides, "Override a config key, e.g. --set train.threads=2")
      ->type_name("KEY=VALUE");
  train->add_option("--warmup", args->options.warmup, "Untimed steps first")
      ->capture_default_str()
      ->check(non_negative_number());
  train->add_option("--steps", args->options.steps, "Timed steps")->capture_default_str()->check(positive_number());
  train->add_option("--peak-size", args->options.peak_size,
                    "Side of the square matmul whose FLOP/s is the MFU reference (default 2048 CPU, 8192 CUDA)")
      ->check(non_negative_number());
  train->add_option("--dump", args->options.dump_dir,
                    "Write weights.pt, batch.pt, reference.json (loss), config.json and optimizer.json (AdamW's "
                    "parameter groups) here before the timed steps, for scripts/bench_pytorch.py")
      ->type_name("DIR");
  train->add_option("--compare", args->compare_path,
                    "Also run this config (same --set), alternating steps with CONFIG in one process, and report "
                    "the step-time ratio CONFIG/OTHER (e.g. CONFIG coupled, OTHER its base)")
      ->type_name("OTHER");
  train->add_flag("--profile", args->profile, "After the timing, profile " + std::to_string(kProfiledBenchSteps) +
                                                " more steps: profile/<run.name>-bench.json (Chrome trace) and a "
                                                "table by cqk range in the log");
  train->add_flag("--json", args->json, "Print one JSON object instead of text");
  train->callback([args] {
    const Config config = args->config_path.empty() ? default_config(args->overrides)
                                                    : load_config(args->config_path, args->overrides);
    if (args->profile) {
      if (!args->compare_path.empty()) throw std::invalid_argument("bench: --profile and --compare do not go together");
      args->options.profile_trace = "profile/" + config.run.name + "-bench.json";
    }
    if (!args->compare_path.empty()) {
      const auto comparison = compare_training(config, load_config(args->compare_path, args->overrides), args->options);
      std::cout << (args->json ? to_json(comparison) + "\n" : describe(comparison)) << std::flush;
      return;
    }
    const auto result = benchmark_training(config, args->options);
    if (args->json)
      std::cout << to_json(result) << std::endl;
    else
      std::cout << describe(result) << std::flush;
  });
  add_bench_data_command(*bench);
  add_bench_coupling_command(*bench);
}

}  // namespace cqk::cli
