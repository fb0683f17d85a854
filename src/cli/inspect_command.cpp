// `cqk inspect [CONFIG] [--set k=v]...`: the resolved model of a config (its
// shape, parameter counts by part, coupling share and FLOPs per token), or with
// --yaml the fully resolved config, without training anything.
// `cqk inspect RUN_DIR`: the same for a run, and whether it uses its coupling
// (coupling_diagnostics.h): as logged at its evaluations, and per layer for
// its newest checkpoint on one validation batch.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"
#include "cqk/batch_source.h"
#include "cqk/config_loader.h"
#include "cqk/coupling_diagnostics.h"
#include "cqk/evaluation_report.h"
#include "cqk/model.h"
#include "cqk/runtime.h"
#include "cqk/token_file.h"
#include "cqk/trainer.h"
#include "cqk/trained_model.h"
#include "support/printf_number.h"
#include "train/run_setup.h"

namespace cqk::cli {
namespace {

namespace fs = std::filesystem;

// model.vocab_size 0 is taken from the data, as `cqk train` does.
void resolve_vocab_size(Config& config) {
  int64_t data_vocab = 0;
  std::string data_source;
  if (config.data.kind == DataKind::Recall) {
    data_vocab = config.data.recall.vocab_size;
    data_source = "data.recall.vocab_size";
  } else {
    const auto train_file = (fs::path(config.data.dir) / "train.bin").string();
    if (fs::exists(train_file)) {
      data_vocab = TokenFile(train_file).vocab_size();
      data_source = train_file;
    } else if (config.model.vocab_size == 0) {
      throw std::invalid_argument("model.vocab_size is 0 (take it from the data) but " + train_file +
                                  " does not exist; set model.vocab_size or encode the data first");
    }
  }
  take_vocab_size_from_data(config.model, data_vocab, data_source);
}

std::string millions(int64_t count) {
  return printf_number(count >= 1000000 ? "%.1fM" : "%.3fM", static_cast<double>(count) / 1e6);
}

std::string flops(double value) {
  if (value >= 1e9) return printf_number("%.2f GFLOP", value / 1e9);
  if (value >= 1e6) return printf_number("%.2f MFLOP", value / 1e6);
  return printf_number("%.2f kFLOP", value / 1e3);
}

std::string coupling_summary(const CouplingOptions& c) {
  if (c.kind() == CouplingKind::None) return "none";
  std::string text = to_string(c.kind()) + " (";
  if (c.kind() == CouplingKind::Dynamics)
    text += to_string(c.integrator()) + ", steps " + std::to_string(c.steps()) + ", dt_init " +
            printf_number("%g", c.dt_init());
  else
    text += "hidden " + std::to_string(c.hidden()) + ", steps " + std::to_string(c.steps()) + ", clamp " +
            printf_number("%g", c.clamp());
  if (c.shared_across_heads()) text += ", shared across heads";
  if (c.separate_pairs()) text += ", separate pairs";
  return text + ")";
}

void print_summary(const Config& config, const std::string& source) {
  configure_threads(static_cast<int>(config.train.threads));
  const auto& m = config.model;
  TransformerLM model(m);  // on the CPU, fp32
  const auto counts = model->parameter_breakdown();
  const int64_t mlp_hidden = mlp_hidden_size(m);
  const int64_t kv_heads = m.kv_heads > 0 ? m.kv_heads : m.heads;

  const auto kind = m.attention.kind();
  const auto& mta = m.attention.mta();
  std::string details;
  if (kind == AttentionKind::MultiToken)
    details = "every " + std::to_string(mta.every()) + ", kernels " + std::to_string(mta.query_kernel()) + "x" +
              std::to_string(mta.key_kernel()) + ", head group " + std::to_string(mta.head_group());
  // Shown when it is not the papers' 1: it decides whether small models learn at all.
  if ((kind == AttentionKind::MultiToken || kind == AttentionKind::Differential) &&
      m.attention.head_norm_init() != 1.0)
    details += (details.empty() ? "" : ", ") + std::string("head norm init ") +
               printf_number("%g", m.attention.head_norm_init());
  const std::string attention = to_string(kind) + (details.empty() ? "" : " (" + details + ")");
  std::cout << "config: " << source << "\n";
  std::cout << "model: attention " << attention << " | coupling " << coupling_summary(m.attention.coupling())
            << " | layers " << m.layers << " | width " << m.width << " | heads " << m.heads << " (kv " << kv_heads
            << ") | head dim " << m.width / m.heads << " | mlp " << to_string(m.mlp) << " " << mlp_hidden << " | vocab "
            << m.vocab_size << "\n";
  std::cout << "data: " << to_string(config.data.kind) << " | seq_len " << config.data.seq_len << " | batch "
            << config.data.batch_size << "\n";
  std::cout << counts.describe() << "\n";
  std::cout << "params: " << millions(counts.total()) << " (" << counts.total() << ")\n";
  const double share = counts.total() > 0 ? 100.0 * counts.coupling / static_cast<double>(counts.total()) : 0.0;
  std::cout << "coupling share: " << printf_number("%.3f", share) << "% (" << counts.coupling << " parameters)\n";
  std::cout << "flops per token: " << flops(model->flops_per_token(config.data.seq_len))
            << " (training, forward + backward, seq_len " << config.data.seq_len << ")\n";
}

void print_diagnostics_row(const std::string& label, const CouplingDiagnostics& d) {
  const auto cell = [](const std::optional<double>& value) {
    return value ? printf_number("%10.4f", *value) : std::string("         -");
  };
  char head[64];
  std::snprintf(head, sizeof head, "%8s", label.c_str());
  std::cout << head << cell(d.q_change) << cell(d.k_change) << cell(d.mean_abs_log_scale) << cell(d.mean_log_det)
            << "\n";
}

const char* kDiagnosticsHeader = "    step  q change  k change  mean |s|   log det\n";

// The diagnostics logged at each evaluation and at the end (metrics.jsonl's last
// line; results.json's, for runs whose final line did not carry them).
void print_logged_diagnostics(const fs::path& run_dir) {
  std::cout << "\ncoupling at each evaluation (means over layers, one validation batch):\n" << kDiagnosticsHeader;
  std::ifstream results_file(run_dir / "results.json");
  const auto results = nlohmann::json::parse(results_file, nullptr, /*allow_exceptions=*/false);
  const bool finished = !results.is_discarded() && results.contains("coupling");
  const int64_t final_step = finished ? results.value("steps", int64_t{-1}) : -1;
  int rows = 0;
  bool final_logged = false;
  std::ifstream metrics(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto entry = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (entry.is_discarded() || !entry.contains("coupling")) continue;  // a torn last line is skipped too
    const int64_t step = entry["step"].get<int64_t>();
    // The final line: the only one with the test split's evaluation.
    const bool final_line = step == final_step && entry.contains("test_loss");
    final_logged = final_logged || final_line;
    print_diagnostics_row(final_line ? "final" : std::to_string(step),
                          mean_over_layers(coupling_from_json(entry["coupling"])));
    ++rows;
  }
  if (finished && !final_logged) {
    print_diagnostics_row("final", mean_over_layers(coupling_from_json(results["coupling"])));
    ++rows;
  }
  if (rows == 0) std::cout << "  none logged (no evaluation yet, or the run predates the diagnostics)\n";
}

// The newest checkpoint's diagnostics per layer, computed now.
void print_current_diagnostics(const std::string& run_dir) {
  try {
    auto trained = load_trained_model(run_dir, "auto");
    auto batches = make_batch_source(trained.config.data, trained.config.run.seed)->eval_batches(Split::Valid, 1);
    if (batches.empty()) throw std::runtime_error("the validation split is empty");
    const auto device = trained.model->embedding->weight.device();
    const auto layers = coupling_diagnostics(trained.model, batches.front().inputs.to(device));
    std::cout << "\ncoupling per layer at step " << trained.step << " (" << trained.checkpoint
              << ", one validation batch):\n"
              << "   layer  q change  k change  mean |s|   log det\n";
    for (const auto& layer : layers) print_diagnostics_row(std::to_string(layer.layer), layer);
  } catch (const std::exception& e) {
    std::cout << "\ncoupling per layer: not computed: " << one_line(e.what()) << "\n";
  }
}

void print_run(const std::string& run_dir) {
  Config config = load_run_config(run_dir);
  print_summary(config, (fs::path(run_dir) / "config.yaml").string());
  if (config.model.attention.coupling().kind() == CouplingKind::None) return;
  print_logged_diagnostics(run_dir);
  print_current_diagnostics(run_dir);
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  struct Arguments {
    std::string config_path;
    std::vector<std::string> overrides;
    bool yaml = false;
  };
  auto args = std::make_shared<Arguments>();
  auto* inspect = app.add_subcommand(
      "inspect", "Show the model a config builds (shape, parameters, FLOPs per token), or a run's and its coupling");
  inspect->add_option("config", args->config_path,
                      "YAML config file (omitted: the embedded configs/default.yaml), or a run directory: its model "
                      "and how far its coupling moves q and k")
      ->type_name("CONFIG_OR_RUN_DIR");
  inspect->add_option("--set", args->overrides, "Override a config key, e.g. --set model.layers=4")
      ->type_name("KEY=VALUE");
  inspect->add_flag("--yaml", args->yaml, "Print the fully resolved config as YAML instead");
  inspect->callback([args] {
    if (!args->config_path.empty() && fs::is_directory(args->config_path)) {
      if (!args->overrides.empty() || args->yaml)
        throw std::invalid_argument("inspect " + args->config_path + ": --set and --yaml apply to configs, not runs");
      print_run(args->config_path);
      exit_status() = 0;
      return;
    }
    Config config = args->config_path.empty() ? default_config(args->overrides)
                                              : load_config(args->config_path, args->overrides);
    resolve_vocab_size(config);
    if (args->yaml) {
      std::cout << to_yaml(config);
    } else {
      print_summary(config, args->config_path.empty() ? "<embedded default>" : args->config_path);
    }
    exit_status() = 0;
  });
}

}  // namespace cqk::cli
