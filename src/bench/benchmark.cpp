#include "bench/benchmark.h"

#include <ATen/core/Dict.h>
#include <sys/resource.h>
#include <unistd.h>
#include <torch/cuda.h>
#include <torch/serialize.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "cqk/batch_source.h"
#include "cqk/checkpoint.h"
#include "cqk/config_loader.h"
#include "cqk/device.h"
#include "cqk/distributed.h"
#include "cqk/matmul_peak.h"
#include "cqk/model.h"
#include "cqk/runtime.h"
#include "cqk/sdpa_backend.h"
#include "cqk/train_step.h"
#include "train/run_setup.h"
#include "export/model_config_json.h"
#include "train/step_profiler.h"

#ifdef CQK_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace cqk {

static std::string cpu_model_name() {
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

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

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

// CPU time of the whole machine (busy, all cores) and of this process, to tell
// how much of the machine other processes took while the steps were timed.
struct CpuSnapshot {
  double machine_busy_s = -1;  // -1: /proc/stat unreadable
  double self_s = 0;
  Clock::time_point at = Clock::now();
};

CpuSnapshot cpu_snapshot() {
  CpuSnapshot snap;
  std::ifstream stat("/proc/stat");
  std::string cpu;
  unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal && cpu == "cpu") {
    const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
    snap.machine_busy_s = static_cast<double>(user + nice + system + irq + softirq + steal) / tick;
  }
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) == 0) {
    const auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * t.tv_usec; };
    snap.self_s = seconds(usage.ru_utime) + seconds(usage.ru_stime);
  }
  snap.at = Clock::now();
  return snap;
}

// Cores' worth of CPU that other processes used between two snapshots (nullopt without /proc/stat).
std::optional<double> other_cpu_load(const CpuSnapshot& from, const CpuSnapshot& to) {
  if (from.machine_busy_s < 0 || to.machine_busy_s < 0) return std::nullopt;
  const double wall = std::chrono::duration<double>(to.at - from.at).count();
  if (wall <= 0) return std::nullopt;
  const double others = (to.machine_busy_s - from.machine_busy_s) - (to.self_s - from.self_s);
  return std::max(0.0, others / wall);
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
  // VmHWM, which reset_peak_rss() can lower; getrusage's ru_maxrss where /proc is missing.
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // kB
  }
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

bool reset_peak_rss() {
  // Linux >= 4.0: "5" resets the high-water mark to the current RSS (proc(5), clear_refs).
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
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

std::string optimizer_groups_json(TransformerLM& model, const TrainConfig& train) {
  json groups = json::array();
  for (const auto& g : optimizer_groups(model, train))
    groups.push_back({{"weight_decay", g.decayed ? train.weight_decay : 0.0}, {"lr_scale", g.lr_scale},
                      {"params", g.names}});
  return groups.dump();
}

namespace {

void check_options(const BenchOptions& options) {
  if (options.warmup < 0) throw std::invalid_argument("bench: --warmup must be >= 0");
  if (options.steps < 1) throw std::invalid_argument("bench: --steps must be >= 1");
  if (options.peak_size < 0) throw std::invalid_argument("bench: --peak-size must be >= 0");
}

// One config's model, optimizer and batch source, stepping as the trainer does.
class Session {
 public:
  Session(const Config& input_config, const BenchOptions& options) {
    // The trainer's order: set_up_run (seed, batch source), then model, optimizer.
    auto setup = set_up_run(input_config);
    config_ = std::move(setup.config);
    source_ = std::move(setup.source);
    auto& r = result_;
    r.name = config_.run.name;
    r.threads = setup.threads;
    r.torch_version = TORCH_VERSION;
    r.config_json = config_json(config_).dump();
    device_ = choose_device(config_.train.device);
    bf16_ = use_bf16(config_.train, device_);
    r.device = device_.str();
    r.device_name = device_name(device_);
    r.dtype = bf16_ ? "bf16" : "fp32";
    r.sdpa_backend = use_sdpa_backend(config_, config_.data.batch_size, bf16_, device_.is_cuda());
    model_ = TransformerLM(config_.model, static_cast<uint64_t>(config_.run.seed));
    model_->to(device_);
    optimizer_ = make_optimizer(model_, config_.train);
    r.optimizer_groups_json = optimizer_groups_json(model_, config_.train);
    model_->train();
    dist_ = std::make_unique<DistributedContext>(DistributedEnvironment{}, device_);  // one process
    step_ = std::make_unique<StepContext>(StepContext{model_, *optimizer_, *source_, config_.train, device_, bf16_, *dist_});
    const auto breakdown = model_->parameter_breakdown();
    r.params = breakdown.total();
    r.coupling_params = breakdown.coupling;
    r.tokens_per_step = config_.data.batch_size * config_.data.seq_len * config_.train.grad_accum;
    r.flops_per_token = model_->flops_per_token(config_.data.seq_len);
    r.warmup = options.warmup;
    r.steps = options.steps;
    r.step_seconds.reserve(static_cast<size_t>(options.steps));
  }

  // The trainer's step (train_step.h; constant lr: the schedule costs nothing); returns the loss.
  double step() {
    const double loss = accumulate_gradients(*step_);
    apply_gradients(*step_);
    synchronize(device_);
    return loss;
  }

  // A timed step, recorded in the result.
  void timed_step() {
    const auto start = Clock::now();
    const double loss = step();
    result_.step_seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    if (result_.step_seconds.size() == 1) result_.first_loss = loss;
    result_.last_loss = loss;
  }

  // weights.pt, batch.pt (the next training batch, not consumed), reference.json, config.json,
  // optimizer.json (the optimizer groups, which bench_pytorch.py builds its AdamW from).
  void dump(const std::string& dir) {
    namespace fs = std::filesystem;
    fs::create_directories(dir);
    const auto path = [&](const char* name) { return (fs::path(dir) / name).string(); };
    save_weights_for_python(path("weights.pt"), *model_);
    const int64_t position = source_->train_position();
    const auto batch = source_->next_train();
    source_->seek_train(position);
    c10::Dict<std::string, at::Tensor> tensors;
    tensors.insert("inputs", batch.inputs);
    tensors.insert("targets", batch.targets);
    const auto bytes = torch::pickle_save(c10::IValue(tensors));
    write_text(path("batch.pt"), std::string(bytes.begin(), bytes.end()));
    double loss = 0.0;
    {
      at::NoGradGuard no_grad;
      AutocastScope autocast(device_, bf16_);
      loss = model_->loss(batch.inputs.to(device_), batch.targets.to(device_)).item<double>();
    }
    const json reference = {{"loss", loss}, {"after_steps", result_.warmup}, {"dtype", result_.dtype}};
    write_text(path("reference.json"), reference.dump(2) + "\n");
    write_text(path("config.json"), json::parse(result_.config_json).dump(2) + "\n");
    write_text(path("optimizer.json"), json::parse(result_.optimizer_groups_json).dump(2) + "\n");
  }

  // Throughput and memory from the timed steps; `timed_seconds` is their wall time.
  void finish(double timed_seconds) {
    auto& r = result_;
    r.cuda_peak_bytes = cuda_peak(device_);
    r.peak_rss_bytes = peak_rss_bytes();  // since reset_peak_rss(), before the timed steps
    r.step = spread_of(r.step_seconds);
    r.tokens_per_s = static_cast<double>(r.tokens_per_step) / std::max(r.step.median, 1e-12);
    r.tokens_per_s_mean = static_cast<double>(r.tokens_per_step * static_cast<int64_t>(r.step_seconds.size())) /
                          std::max(timed_seconds, 1e-12);
    r.achieved_flops = r.tokens_per_s * r.flops_per_token;
  }

  // MFU against the matmul peak PeakMeter measured (best of before and after the timed steps).
  void set_peak(double measured_peak, int64_t size) {
    auto& r = result_;
    r.peak_size = size;
    r.measured_peak_flops = measured_peak;
    r.mfu_measured = r.achieved_flops / measured_peak;
    if (device_.is_cuda()) {
      r.datasheet_peak_flops = datasheet_peak_flops(r.device_name, r.dtype, &r.datasheet_source);
      if (r.datasheet_peak_flops) r.mfu_datasheet = r.achieved_flops / *r.datasheet_peak_flops;
    }
  }

  const c10::Device& device() const { return device_; }
  bool bf16() const { return bf16_; }
  BenchResult& result() { return result_; }

 private:
  Config config_;
  BenchResult result_;
  std::unique_ptr<BatchSource> source_;
  c10::Device device_{c10::kCPU};
  bool bf16_ = false;
  TransformerLM model_{nullptr};
  std::unique_ptr<FusedAdamW> optimizer_;
  std::unique_ptr<DistributedContext> dist_;
  std::unique_ptr<StepContext> step_;
};

// The matmul peak, best of two measurements (before and after the timed steps),
// 10 repeats each on the CPU: a peak taken while another process holds a core
// would understate the peak and overstate MFU.
class PeakMeter {
 public:
  PeakMeter(const BenchOptions& options, const Session& session)
      : device_(session.device()),
        dtype_(session.bf16() ? at::kBFloat16 : at::kFloat),
        size_(options.peak_size > 0 ? options.peak_size : (device_.is_cuda() ? 8192 : 2048)) {}
  void measure() {
    best_ = std::max(best_, measure_matmul_flops(device_, dtype_, size_, device_.is_cuda() ? 5 : 10));
  }
  void apply(std::initializer_list<Session*> sessions) const {
    for (Session* s : sessions) s->set_peak(best_, size_);
  }

 private:
  c10::Device device_;
  c10::ScalarType dtype_;
  int64_t size_;
  double best_ = 0.0;
};

}  // namespace

BenchResult benchmark_training(const Config& config, const BenchOptions& options) {
  check_options(options);
  Session session(config, options);
  for (int64_t i = 0; i < options.warmup; ++i) session.step();
  if (!options.dump_dir.empty()) session.dump(options.dump_dir);
  PeakMeter peak(options, session);
  peak.measure();
  reset_peak_rss();
  reset_cuda_peak(session.device());
  const auto cpu_start = cpu_snapshot();
  for (int64_t i = 0; i < options.steps; ++i) session.timed_step();
  const auto cpu_end = cpu_snapshot();
  session.finish(std::chrono::duration<double>(cpu_end.at - cpu_start.at).count());
  session.result().other_cpu_load = other_cpu_load(cpu_start, cpu_end);
  peak.measure();
  peak.apply({&session});
  if (!options.profile_trace.empty()) {  // after the timing, which the profiler would slow
    StepProfiler profiler({1, kProfiledBenchSteps}, options.profile_trace, session.device());
    for (int64_t i = 1; i <= kProfiledBenchSteps; ++i) {
      profiler.begin_step(i);
      session.step();
      profiler.end_step(i);
    }
  }
  return session.result();
}

BenchComparison compare_training(const Config& config, const Config& other, const BenchOptions& options) {
  check_options(options);
  if (!options.dump_dir.empty()) throw std::invalid_argument("bench: --dump and --compare do not go together");
  // Torch's SDPA order is one per process: both configs run under the same.
  if (config.train.sdpa_backend != other.train.sdpa_backend)
    throw std::invalid_argument("bench --compare: the two configs set different train.sdpa_backend (" +
                                to_string(config.train.sdpa_backend) + ", " + to_string(other.train.sdpa_backend) +
                                ")");
  Session a(config, options), b(other, options);
  if (a.device() != b.device()) throw std::invalid_argument("bench --compare: the two configs use different devices");
  for (int64_t i = 0; i < options.warmup; ++i) {
    a.step();
    b.step();
  }
  PeakMeter peak(options, a);
  peak.measure();
  reset_peak_rss();
  reset_cuda_peak(a.device());
  BenchComparison out;
  double seconds_a = 0.0, seconds_b = 0.0;
  const auto cpu_start = cpu_snapshot();
  for (int64_t i = 0; i < options.steps; ++i) {
    // Alternate which goes first, so neither always follows the other's memory traffic.
    Session& first = i % 2 == 0 ? a : b;
    Session& second = i % 2 == 0 ? b : a;
    first.timed_step();
    second.timed_step();
    const double ta = a.result().step_seconds.back(), tb = b.result().step_seconds.back();
    seconds_a += ta;
    seconds_b += tb;
    out.step_time_ratios.push_back(ta / tb);
  }
  const auto cpu_end = cpu_snapshot();
  a.finish(seconds_a);
  b.finish(seconds_b);
  a.result().other_cpu_load = b.result().other_cpu_load = other_cpu_load(cpu_start, cpu_end);
  peak.measure();
  peak.apply({&a, &b});
  out.a = a.result();
  out.b = b.result();
  out.ratio = spread_of(out.step_time_ratios);
  out.ratio_of_medians = out.a.step.median / out.b.step.median;
  out.ratio_of_minima = out.a.step.min / out.b.step.min;
  return out;
}

std::string to_json(const BenchResult& r) {
  json out = {
      {"tool", "cqk"},
      {"name", r.name},
      {"device", r.device},
      {"device_name", r.device_name},
      {"dtype", r.dtype},
      {"sdpa_backend", r.sdpa_backend},
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
      {"other_cpu_load", optional_json(r.other_cpu_load)},
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
      {"config", json::parse(r.config_json)},
      {"optimizer_groups", json::parse(r.optimizer_groups_json)}};
  return out.dump();
}

namespace {
json result_json(const BenchResult& r) { return json::parse(to_json(r)); }
}  // namespace

std::string to_json(const BenchComparison& c) {
  const json out = {{"a", result_json(c.a)},
                    {"b", result_json(c.b)},
                    {"step_time_ratios", c.step_time_ratios},
                    {"step_time_ratio",
                     {{"median", c.ratio.median},
                      {"min", c.ratio.min},
                      {"max", c.ratio.max},
                      {"p25", c.ratio.p25},
                      {"p75", c.ratio.p75},
                      {"mean", c.ratio.mean}}},
                    {"ratio_of_medians", c.ratio_of_medians},
                    {"ratio_of_minima", c.ratio_of_minima}};
  return out.dump();
}

std::string describe(const BenchComparison& c) {
  char line[512];
  std::snprintf(line, sizeof line,
                "step-time ratio %s / %s, steps alternated in one process: median of per-step ratios %.3f "
                "(IQR %.3f..%.3f, min %.3f, max %.3f) | ratio of medians %.3f | ratio of minima %.3f\n",
                c.a.name.c_str(), c.b.name.c_str(), c.ratio.median, c.ratio.p25, c.ratio.p75, c.ratio.min,
                c.ratio.max, c.ratio_of_medians, c.ratio_of_minima);
  return describe(c.a) + "\n" + describe(c.b) + "\n" + line;
}

std::string describe(const BenchResult& r) {
  std::ostringstream out;
  char line[512];
  const double ms = 1e3;
  std::snprintf(line, sizeof line, "bench %s: %s (%s), %s, SDPA %s, %d threads, torch %s\n", r.name.c_str(),
                r.device.c_str(), r.device_name.c_str(), r.dtype.c_str(), r.sdpa_backend.c_str(), r.threads,
                r.torch_version.c_str());
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
  if (r.other_cpu_load) {
    std::snprintf(line, sizeof line, "machine     other processes used %.2f cores during the timed steps%s\n",
                  *r.other_cpu_load, *r.other_cpu_load > 0.2 ? " (figures taken under load)" : "");
    out << line;
  }
  return out.str();
}

}  // namespace cqk
