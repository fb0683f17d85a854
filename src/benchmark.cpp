#include "cqk/benchmark.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/Dict.h>
#include <sys/resource.h>
#include <torch/cuda.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/serialize.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "cqk/batch_source.h"
#include "cqk/checkpoint.h"
#include "cqk/config_loader.h"
#include "cqk/flops.h"
#include "cqk/model.h"
#include "cqk/runtime.h"
#include "cqk/trainer.h"

#ifdef CQK_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace cqk {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// The trainer's device and dtype rules (train.device, train.dtype).
c10::Device choose_device(const std::string& name) {
  const bool cuda = torch::cuda::is_available();
  if (name == "cuda" && !cuda) throw std::invalid_argument("train.device: cuda requested but no GPU is visible");
  if (name == "cpu" || (name == "auto" && !cuda)) return c10::Device(c10::kCPU);
  if (name == "cuda" || name == "auto") return c10::Device(c10::kCUDA, 0);
  throw std::invalid_argument("train.device: expected auto|cpu|cuda, got '" + name + "'");
}

bool use_bf16(const TrainConfig& train, const c10::Device& device) {
  if (train.dtype == "auto") return device.is_cuda();
  if (train.dtype == "bf16") return true;
  if (train.dtype == "fp32") return false;
  throw std::invalid_argument("train.dtype: expected auto|fp32|bf16, got '" + train.dtype + "'");
}

// bf16 autocast for the forward pass, as in the trainer.
class AutocastScope {
 public:
  AutocastScope(const c10::Device& device, bool enabled) : type_(device.type()), enabled_(enabled) {
    if (!enabled_) return;
    previous_ = at::autocast::is_autocast_enabled(type_);
    at::autocast::set_autocast_dtype(type_, at::kBFloat16);
    at::autocast::set_autocast_enabled(type_, true);
  }
  ~AutocastScope() {
    if (!enabled_) return;
    at::autocast::set_autocast_enabled(type_, previous_);
    at::autocast::clear_cache();
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType type_;
  bool enabled_;
  bool previous_ = false;
};

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) break;
    auto name = line.substr(colon + 1);
    name.erase(0, name.find_first_not_of(" \t"));
    return name;
  }
  return "unknown CPU";
}

std::string device_name(const c10::Device& device) {
#ifdef CQK_WITH_CUDA
  if (device.is_cuda()) return at::cuda::getDeviceProperties(device.index())->name;
#endif
  return device.is_cuda() ? "CUDA device" : cpu_model_name();
}

void reset_cuda_peak(const c10::Device& device) {
#ifdef CQK_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#else
  (void)device;
#endif
}

std::optional<int64_t> cuda_peak(const c10::Device& device) {
#ifdef CQK_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  }
#else
  (void)device;
#endif
  return std::nullopt;
}

void synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) throw std::runtime_error(path + ": cannot write");
}

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0.0;
  const double position = q * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(position));
  const auto hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (position - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

json optional_json(const std::optional<double>& value) { return value ? json(*value) : json(nullptr); }

}  // namespace

Spread spread_of(std::vector<double> values) {
  Spread s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.min = values.front();
  s.max = values.back();
  s.median = percentile(values, 0.5);
  s.p25 = percentile(values, 0.25);
  s.p75 = percentile(values, 0.75);
  double sum = 0.0;
  for (double v : values) sum += v;
  s.mean = sum / static_cast<double>(values.size());
  return s;
}

int64_t peak_rss_bytes() {
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

std::optional<double> datasheet_peak_flops(const std::string& device_name, const std::string& dtype,
                                           std::string* source) {
  // NVIDIA H100 SXM and H200 SXM datasheets (nvidia.com/en-us/data-center/h100 and /h200):
  // BF16 Tensor Core 1,979 TFLOP/s "with sparsity", i.e. 989 TFLOP/s dense; FP32 67 TFLOP/s.
  // The PCIe/NVL parts are lower; only the SXM figures are used, so other names give nullopt.
  const bool hopper_sxm = (device_name.find("H100") != std::string::npos ||
                           device_name.find("H200") != std::string::npos) &&
                          device_name.find("PCIe") == std::string::npos && device_name.find("NVL") == std::string::npos;
  if (!hopper_sxm) return std::nullopt;
  if (source)
    *source = "NVIDIA H100/H200 SXM datasheet: BF16 Tensor Core 1979 TFLOP/s with 2:4 sparsity = 989 dense; "
              "FP32 67 TFLOP/s";
  if (dtype == "bf16") return 989e12;
  if (dtype == "fp32") return 67e12;
  return std::nullopt;
}

std::string config_json(const Config& c) {
  const auto& m = c.model;
  const auto& a = m.attention;
  const auto& cp = a.coupling;
  const auto& d = c.data;
  const auto& t = c.train;
  json out = {
      {"run", {{"name", c.run.name}, {"seed", c.run.seed}}},
      {"model",
       {{"vocab_size", m.vocab_size},
        {"width", m.width},
        {"layers", m.layers},
        {"heads", m.heads},
        {"kv_heads", m.kv_heads},
        {"mlp", m.mlp},
        {"mlp_hidden", m.mlp_hidden},
        {"rope_base", m.rope_base},
        {"init_std", m.init_std},
        {"norm_eps", m.norm_eps},
        {"attention",
         {{"kind", a.kind},
          {"coupling",
           {{"kind", cp.kind},
            {"hidden", cp.hidden},
            {"steps", cp.steps},
            {"clamp", cp.clamp},
            {"shared_across_heads", cp.shared_across_heads},
            {"separate_pairs", cp.separate_pairs},
            {"integrator", cp.integrator},
            {"dt_init", cp.dt_init},
            {"recompute_from_inverse", cp.recompute_from_inverse}}},
          {"mta",
           {{"every", a.mta.every},
            {"query_kernel", a.mta.query_kernel},
            {"key_kernel", a.mta.key_kernel},
            {"head_group", a.mta.head_group}}}}}}},
      {"data",
       {{"kind", d.kind},
        {"seq_len", d.seq_len},
        {"batch_size", d.batch_size},
        {"recall", {{"vocab_size", d.recall.vocab_size}, {"pairs", d.recall.pairs}}}}},
      {"train",
       {{"lr", t.lr},
        {"weight_decay", t.weight_decay},
        {"beta1", t.beta1},
        {"beta2", t.beta2},
        {"eps", t.eps},
        {"grad_clip", t.grad_clip},
        {"grad_accum", t.grad_accum},
        {"decay_norms_and_biases", t.decay_norms_and_biases},
        {"decay_embeddings", t.decay_embeddings},
        {"device", t.device},
        {"dtype", t.dtype},
        {"threads", t.threads}}}};
  return out.dump();
}

BenchResult benchmark_training(const Config& input_config, const BenchOptions& options) {
  if (options.warmup < 0) throw std::invalid_argument("bench: --warmup must be >= 0");
  if (options.steps < 1) throw std::invalid_argument("bench: --steps must be >= 1");
  if (options.peak_size < 0) throw std::invalid_argument("bench: --peak-size must be >= 0");
  Config config = input_config;
  validate(config);

  BenchResult result;
  result.name = config.run.name;
  result.threads = configure_threads(static_cast<int>(config.train.threads));
  result.torch_version = TORCH_VERSION;
  // The trainer's order: seed, batch source, model, optimizer.
  at::manual_seed(static_cast<uint64_t>(config.run.seed));
  auto source = make_batch_source(config.data, config.run.seed);
  if (config.model.vocab_size == 0) config.model.vocab_size = source->vocab_size();
  if (config.model.vocab_size < source->vocab_size())
    throw std::invalid_argument("model.vocab_size (" + std::to_string(config.model.vocab_size) +
                                ") is smaller than the data's vocabulary (" + std::to_string(source->vocab_size()) +
                                ")");
  result.config_json = config_json(config);

  const auto device = choose_device(config.train.device);
  const bool bf16 = use_bf16(config.train, device);
  result.device = device.str();
  result.device_name = device_name(device);
  result.dtype = bf16 ? "bf16" : "fp32";
  TransformerLM model(config.model);
  model->to(device);
  auto optimizer = make_optimizer(model, config.train);
  model->train();
  const auto breakdown = model->parameter_breakdown();
  result.params = breakdown.total();
  result.coupling_params = breakdown.coupling;
  result.tokens_per_step = config.data.batch_size * config.data.seq_len * config.train.grad_accum;
  result.flops_per_token = model->flops_per_token(config.data.seq_len);
  result.warmup = options.warmup;
  result.steps = options.steps;

  const double max_norm = config.train.grad_clip > 0 ? config.train.grad_clip : std::numeric_limits<double>::max();
  const auto parameters = model->parameters();
  // One training step as the trainer takes it (constant lr: the schedule costs nothing).
  const auto step = [&] {
    optimizer->zero_grad();
    double loss_value = 0.0;
    for (int64_t micro = 0; micro < config.train.grad_accum; ++micro) {
      const auto batch = source->next_train();
      at::Tensor loss;
      {
        AutocastScope autocast(device, bf16);
        loss = model->loss(batch.inputs.to(device), batch.targets.to(device)) /
               static_cast<double>(config.train.grad_accum);
      }
      loss.backward();
      loss_value += loss.item<double>();
    }
    torch::nn::utils::clip_grad_norm_(parameters, max_norm);
    optimizer->step();
    synchronize(device);
    return loss_value;
  };

  for (int64_t i = 0; i < options.warmup; ++i) step();

  if (!options.dump_dir.empty()) {
    namespace fs = std::filesystem;
    fs::create_directories(options.dump_dir);
    const auto path = [&](const char* name) { return (fs::path(options.dump_dir) / name).string(); };
    save_weights_for_python(path("weights.pt"), *model);
    // The next training batch, without consuming it: the timed steps start with it.
    const int64_t position = source->train_position();
    const auto batch = source->next_train();
    source->seek_train(position);
    c10::Dict<std::string, at::Tensor> tensors;
    tensors.insert("inputs", batch.inputs);
    tensors.insert("targets", batch.targets);
    const auto bytes = torch::pickle_save(c10::IValue(tensors));
    write_text(path("batch.pt"), std::string(bytes.begin(), bytes.end()));
    double loss = 0.0;
    {
      at::NoGradGuard no_grad;
      AutocastScope autocast(device, bf16);
      loss = model->loss(batch.inputs.to(device), batch.targets.to(device)).item<double>();
    }
    json reference = {{"loss", loss}, {"after_steps", options.warmup}, {"dtype", result.dtype}};
    write_text(path("reference.json"), reference.dump(2) + "\n");
    write_text(path("config.json"), json::parse(result.config_json).dump(2) + "\n");
  }

  reset_cuda_peak(device);
  result.step_seconds.reserve(static_cast<size_t>(options.steps));
  const auto timed_start = Clock::now();
  for (int64_t i = 0; i < options.steps; ++i) {
    const auto start = Clock::now();
    const double loss = step();
    result.step_seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    if (i == 0) result.first_loss = loss;
    result.last_loss = loss;
  }
  const double timed_seconds = std::chrono::duration<double>(Clock::now() - timed_start).count();
  result.cuda_peak_bytes = cuda_peak(device);
  result.peak_rss_bytes = peak_rss_bytes();  // before the peak matmul's own buffers

  result.step = spread_of(result.step_seconds);
  result.tokens_per_s = static_cast<double>(result.tokens_per_step) / std::max(result.step.median, 1e-12);
  result.tokens_per_s_mean =
      static_cast<double>(result.tokens_per_step * options.steps) / std::max(timed_seconds, 1e-12);
  result.achieved_flops = result.tokens_per_s * result.flops_per_token;

  result.peak_size = options.peak_size > 0 ? options.peak_size : (device.is_cuda() ? 8192 : 2048);
  result.measured_peak_flops =
      measure_matmul_flops(device, bf16 ? at::kBFloat16 : at::kFloat, result.peak_size, /*repeats=*/5);
  result.mfu_measured = result.achieved_flops / result.measured_peak_flops;
  if (device.is_cuda()) {
    result.datasheet_peak_flops = datasheet_peak_flops(result.device_name, result.dtype, &result.datasheet_source);
    if (result.datasheet_peak_flops) result.mfu_datasheet = result.achieved_flops / *result.datasheet_peak_flops;
  }
  return result;
}

std::string to_json(const BenchResult& r) {
  json out = {
      {"tool", "cqk"},
      {"name", r.name},
      {"device", r.device},
      {"device_name", r.device_name},
      {"dtype", r.dtype},
      {"threads", r.threads},
      {"torch_version", r.torch_version},
      {"params", r.params},
      {"coupling_params", r.coupling_params},
      {"tokens_per_step", r.tokens_per_step},
      {"warmup", r.warmup},
      {"steps", r.steps},
      {"step_seconds", r.step_seconds},
      {"step_time_s",
       {{"median", r.step.median},
        {"min", r.step.min},
        {"max", r.step.max},
        {"p25", r.step.p25},
        {"p75", r.step.p75},
        {"mean", r.step.mean}}},
      {"tokens_per_s", r.tokens_per_s},
      {"tokens_per_s_mean", r.tokens_per_s_mean},
      {"first_loss", r.first_loss},
      {"last_loss", r.last_loss},
      {"peak_rss_bytes", r.peak_rss_bytes},
      {"cuda_peak_bytes", r.cuda_peak_bytes ? json(*r.cuda_peak_bytes) : json(nullptr)},
      {"flops_per_token", r.flops_per_token},
      {"flops_counting", "6 * params (forward + backward, tied embedding counted once) + 12 * layers * width * "
                         "seq_len (attention scores and values, PaLM appendix B)"},
      {"achieved_flops", r.achieved_flops},
      {"measured_peak_flops", r.measured_peak_flops},
      {"peak_matmul_size", r.peak_size},
      {"mfu_measured", r.mfu_measured},
      {"datasheet_peak_flops", optional_json(r.datasheet_peak_flops)},
      {"mfu_datasheet", optional_json(r.mfu_datasheet)},
      {"datasheet_source", r.datasheet_source},
      {"config", json::parse(r.config_json)}};
  return out.dump();
}

std::string describe(const BenchResult& r) {
  std::ostringstream out;
  char line[512];
  const double ms = 1e3;
  std::snprintf(line, sizeof line, "bench %s: %s (%s), %s, %d threads, torch %s\n", r.name.c_str(), r.device.c_str(),
                r.device_name.c_str(), r.dtype.c_str(), r.threads, r.torch_version.c_str());
  out << line;
  std::snprintf(line, sizeof line,
                "params %.3fM (coupling %.4fM) | %lld tokens/step | %lld warm-up + %lld timed steps\n",
                r.params / 1e6, r.coupling_params / 1e6, static_cast<long long>(r.tokens_per_step),
                static_cast<long long>(r.warmup), static_cast<long long>(r.steps));
  out << line;
  std::snprintf(line, sizeof line, "step time   median %.2f ms | min %.2f | max %.2f | IQR %.2f..%.2f ms\n",
                r.step.median * ms, r.step.min * ms, r.step.max * ms, r.step.p25 * ms, r.step.p75 * ms);
  out << line;
  std::snprintf(line, sizeof line, "throughput  %.0f tokens/s (median step) | %.0f tokens/s (mean)\n",
                r.tokens_per_s, r.tokens_per_s_mean);
  out << line;
  if (r.cuda_peak_bytes)
    std::snprintf(line, sizeof line, "memory      peak RSS %.1f MiB | CUDA allocator peak %.1f MiB\n",
                  r.peak_rss_bytes / 1048576.0, *r.cuda_peak_bytes / 1048576.0);
  else
    std::snprintf(line, sizeof line, "memory      peak RSS %.1f MiB\n", r.peak_rss_bytes / 1048576.0);
  out << line;
  std::snprintf(line, sizeof line,
                "FLOPs       %.3f MFLOP/token (6 x params + 12 x layers x width x seq_len) | achieved %.2f GFLOP/s\n",
                r.flops_per_token / 1e6, r.achieved_flops / 1e9);
  out << line;
  std::snprintf(line, sizeof line, "MFU         %.1f%% of the measured %s matmul peak %.2f GFLOP/s (%lld^2)\n",
                100.0 * r.mfu_measured, r.dtype.c_str(), r.measured_peak_flops / 1e9,
                static_cast<long long>(r.peak_size));
  out << line;
  if (r.mfu_datasheet) {
    std::snprintf(line, sizeof line, "            %.1f%% of the datasheet dense %s peak %.0f TFLOP/s\n",
                  100.0 * *r.mfu_datasheet, r.dtype.c_str(), *r.datasheet_peak_flops / 1e12);
    out << line;
  }
  std::snprintf(line, sizeof line, "loss        %.4f (first timed step) -> %.4f (last)\n", r.first_loss, r.last_loss);
  out << line;
  return out.str();
}

}  // namespace cqk
