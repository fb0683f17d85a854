#pragma once
// Training throughput, measured: what `cqk bench train` runs. Builds the model
// and the trainer's AdamW from a config, draws batches from the config's batch
// source, runs `warmup` untimed and `steps` timed training steps (batch, forward,
// backward, clip, optimizer step, loss read back) and reports step times,
// tokens/s, peak memory, model FLOPs per token and MFU. docs/BENCHMARKS.md has
// the figures and the PyTorch reference (scripts/bench_pytorch.py).
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cqk/config.h"

namespace cqk {

struct BenchOptions {
  int64_t warmup = 3;      // untimed steps first (thread pools, allocator, caches)
  int64_t steps = 10;      // timed steps, >= 1
  // Non-empty: before the timed steps, write to this folder the weights as they
  // are then (weights.pt, for scripts/bench_pytorch.py), the next training batch
  // (batch.pt: dict inputs, targets), the loss of these weights on that batch
  // (reference.json) and the resolved config (config.json).
  std::string dump_dir;
  int64_t peak_size = 0;   // side of the square matmul for the measured peak; 0: 2048 on CPU, 8192 on CUDA
  // Non-empty: after the timed steps, kProfiledBenchSteps more under the
  // profiler, written to this Chrome trace, with their table in the log.
  std::string profile_trace;
};

constexpr int64_t kProfiledBenchSteps = 3;

// Order statistics of a sample (seconds).
struct Spread {
  double median = 0, min = 0, max = 0, p25 = 0, p75 = 0, mean = 0;
};
Spread spread_of(std::vector<double> values);

struct BenchResult {
  std::string name;                 // run.name
  std::string device;               // "cpu", "cuda:0"
  std::string device_name;          // CPU model or GPU name
  std::string dtype;                // "fp32" or "bf16" (autocast)
  std::string sdpa_backend;         // torch's SDPA backend at the model's shape (sdpa_backend.h)
  int threads = 0;
  std::string torch_version;
  int64_t params = 0, coupling_params = 0;
  int64_t tokens_per_step = 0;      // batch_size * seq_len * grad_accum
  int64_t warmup = 0, steps = 0;
  std::vector<double> step_seconds; // the timed steps
  Spread step;                      // of step_seconds
  double tokens_per_s = 0;          // tokens_per_step / median step time
  double tokens_per_s_mean = 0;     // timed tokens / total timed time
  double first_loss = 0, last_loss = 0;
  int64_t peak_rss_bytes = 0;       // process RSS high-water mark over the timed steps (includes
                                    // the model, optimizer state and libraries resident by then)
  std::optional<int64_t> cuda_peak_bytes;  // caching allocator peak over the timed steps
  // Cores' worth of CPU other processes used during the timed steps (/proc/stat
  // machine busy time minus this process's CPU time); well above 0: taken under load.
  std::optional<double> other_cpu_load;
  double flops_per_token = 0;       // TransformerLM::flops_per_token: 6N + 12 L d T
  double achieved_flops = 0;        // tokens_per_s * flops_per_token
  double measured_peak_flops = 0;   // measure_matmul_flops in the training dtype
  int64_t peak_size = 0;
  double mfu_measured = 0;          // achieved / measured peak
  std::optional<double> datasheet_peak_flops;  // GPU only, for a known device
  std::optional<double> mfu_datasheet;
  std::string datasheet_source;
  std::string config_json;          // config_json() of the resolved config (vocab filled in)
  // The trainer's optimizer groups (trainer.h): [{"weight_decay", "lr_scale", "params": [names]}]
  std::string optimizer_groups_json;
};

// Runs the benchmark; throws std::invalid_argument / std::runtime_error with a
// one-line message on bad input. Sets torch's thread count (train.threads or
// $CQK_NUM_THREADS) and seeds torch with run.seed, as the trainer does.
BenchResult benchmark_training(const Config& config, const BenchOptions& options);

// Two configs (e.g. a coupled model and its base) on the same machine, their
// steps alternated in one process (a, b, b, a, ...), so load and frequency
// drift hit both alike. The ratios are a's step time over b's.
struct BenchComparison {
  BenchResult a, b;
  std::vector<double> step_time_ratios;  // a_i / b_i for timed step i
  Spread ratio;                          // of step_time_ratios
  double ratio_of_medians = 0, ratio_of_minima = 0;
};
BenchComparison compare_training(const Config& config, const Config& other, const BenchOptions& options);

// One JSON object: every field of BenchResult, the config under "config".
std::string to_json(const BenchResult& result);
// Human-readable lines.
std::string describe(const BenchResult& result);
// {"a": ..., "b": ..., "step_time_ratios": [...], "step_time_ratio": {median, ...}, ...}
std::string to_json(const BenchComparison& comparison);
std::string describe(const BenchComparison& comparison);

// Peak resident set size of this process in bytes: VmHWM of /proc/self/status
// (getrusage's ru_maxrss where that is missing).
int64_t peak_rss_bytes();
// Lowers the peak to the current RSS (Linux /proc/self/clear_refs); false when not possible.
bool reset_peak_rss();

// The GPU's name, or the CPU's model name from /proc/cpuinfo.
std::string device_name(const c10::Device& device);

// Dense datasheet peak FLOP/s of a GPU by name for a dtype ("bf16" or "fp32"),
// with its source; nullopt for an unknown device.
std::optional<double> datasheet_peak_flops(const std::string& device_name, const std::string& dtype,
                                           std::string* source = nullptr);

}  // namespace cqk
