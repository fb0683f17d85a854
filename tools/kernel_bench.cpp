// cqk_kernel_bench: GPU checks and timings of the product attention path
// (the fused affine coupling, with RoPE in its pass, feeding torch's SDPA).
//
//   cqk_kernel_bench --check [--quick] the checks of tests/fused_coupling_test.cpp
//                                      (tools/fused_check.h); exit 1 on failure;
//                                      --quick: the small cases only (for compute-sanitizer)
//   cqk_kernel_bench --bench [options] forward and forward+backward timings, a markdown table:
//       --times 512,1024,2048 --batch 8 --heads 12 --dim 64 --hidden 8 --steps 2
//       --dtypes bf16,fp32 --iters 20 --warmup 5 --calls 5
//       --path NAME[,NAME...]: time only these paths (default: all); one path
//                  per process keeps a CUDA fault in one from failing the others
//       --json: one JSON object per (path, dtype, T) instead (scripts/gpu_bundle/run.sh)
//
// Paths, each causal attention over [batch, heads, T, dim] q, k, v:
//   sdpa                 SDPA alone, torch's backend order
//   sdpa-cudnn           SDPA alone, cuDNN first (train.sdpa_backend: cudnn)
//   rope-sdpa            RoPE (one pass per tensor) + SDPA: the base model's path
//   fused-coupling-rope  the fused coupling with RoPE in its pass + SDPA: the coupled model's path
//   fused-coupling       the fused coupling + SDPA; also the coupling alone and its kernels' bandwidth
//   aten-coupling        the ATen coupling + SDPA; also the coupling alone
// Times are medians over iterations of CUDA-event times, each of --calls back-to-back
// calls divided by their number: one call's host work overlaps the GPU's work of
// the one before, as in training. Gradients are cleared before each backward (as
// zero_grad does in training), so no accumulation kernels are timed. TFLOP/s counts
// attention's causal FLOPs (forward 2 B H T^2 d, forward+backward 7 B H T^2 d).
// The forward alone is the training forward (autograd records), so
// forward+backward minus forward is the backward. "coupling share" is the
// coupled path's extra time over the base's, in percent of the base's.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/autograd.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cqk/coupling.h"
#include "ops/cuda_coupling.h"
#include "cqk/rope.h"
#include "cqk/sdpa_backend.h"
#include "tools/fused_check.h"

namespace {

const std::vector<std::string> kPaths{"sdpa", "sdpa-cudnn", "rope-sdpa", "fused-coupling-rope", "fused-coupling",
                                      "aten-coupling"};

const std::vector<std::string> kDtypes{"bf16", "fp32"};

struct Options {
  bool check = false, bench = false, quick = false, json = false;
  std::vector<std::string> paths = kPaths;
  std::vector<int64_t> times{512, 1024, 2048};
  int64_t batch = 8, heads = 12, dim = 64, hidden = 8, steps = 2;
  std::vector<std::string> dtypes = kDtypes;
  int iters = 20, warmup = 5, calls = 5;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> parts;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, ',');)
    if (!part.empty()) parts.push_back(part);
  return parts;
}

// Arguments are checked before the GPU is looked for, so that a wrong one
// fails on any machine (tests/gpu_stage_commands_test.sh rehearses them).
std::vector<std::string> known(const std::string& flag, const std::string& text, const std::vector<std::string>& choices) {
  const auto values = split(text);
  for (const auto& v : values)
    if (std::find(choices.begin(), choices.end(), v) == choices.end())
      throw std::invalid_argument(flag + ": unknown value '" + v + "'");
  return values;
}

int64_t at_least(const std::string& flag, const std::string& text, int64_t minimum) {
  std::size_t used = 0;
  const int64_t v = std::stoll(text, &used);
  if (used != text.size() || v < minimum)
    throw std::invalid_argument(flag + ": expected an integer of at least " + std::to_string(minimum) + ", got '" + text +
                                "'");
  return v;
}

int usage(const char* argv0) {
  std::string paths;
  for (const auto& p : kPaths) paths += (paths.empty() ? "" : ", ") + p;
  std::fprintf(stderr,
               "usage: %s [--check [--quick]] [--bench [--json] [--path NAME,...]] [--times 512,1024,2048] [--batch 8]\n"
               "          [--heads 12] [--dim 64] [--hidden 8] [--steps 2] [--dtypes bf16,fp32] [--iters 20]\n"
               "          [--warmup 5] [--calls 5]\n"
               "paths: %s\n",
               argv0, paths.c_str());
  return 2;
}

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// Median milliseconds of one fn() over iters samples of `calls` back-to-back
// calls each, after warmup calls.
double time_ms(const std::function<void()>& fn, int warmup, int iters, int calls) {
  for (int i = 0; i < warmup; ++i) fn();
  check_cuda(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  const auto stream = c10::cuda::getCurrentCUDAStream().stream();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    check_cuda(cudaEventRecord(start, stream), "cudaEventRecord");
    for (int c = 0; c < calls; ++c) fn();
    check_cuda(cudaEventRecord(stop, stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float elapsed = 0;
    check_cuda(cudaEventElapsedTime(&elapsed, start, stop), "cudaEventElapsedTime");
    ms.push_back(elapsed / calls);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int run_checks(bool quick) {
  int failures = 0;
  uint64_t seed = 100;
  std::vector<cqk::fused_check::Case> cases;
  for (const auto& c : cqk::fused_check::standard_cases())
    if (!quick || c.batch * c.heads * c.time <= 1000) cases.push_back(c);
  for (const auto& c : cases) {
    const auto r = cqk::fused_check::check_kernels(c, seed++);
    std::printf("%s kernels  %-48s worst rel err %.3g\n", r.ok ? "PASS" : "FAIL", c.name().c_str(), r.worst);
    if (!r.ok) std::printf("%s", r.report.c_str()), ++failures;
  }
  for (bool shared : {false, true}) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      if (quick) break;
      cqk::fused_check::Case c;
      c.shared = shared;
      c.dtype = dtype;
      c.strided = true;
      const auto r = cqk::fused_check::check_module_dispatch(c, shared ? 11 : 12);
      std::printf("%s module   %-48s worst rel err %.3g\n", r.ok ? "PASS" : "FAIL", c.name().c_str(), r.worst);
      if (!r.ok) std::printf("%s", r.report.c_str()), ++failures;
    }
  }
  std::printf("checks: %d failed\n", failures);
  return failures == 0 ? 0 : 1;
}

// Median milliseconds of one path, forward alone and forward+backward.
struct Times {
  double fwd = 0, fwd_bwd = 0;
};

// One (path, dtype, T) measurement; 0 for what the path does not have.
struct Row {
  std::string path, dtype, sdpa_backend;
  int64_t T = 0;
  bool applies = true;  // false: a fused path that did not take these inputs (not timed)
  Times times;
  double fwd_flops = 0, fwd_bwd_flops = 0;  // causal attention: 2 and 7 B H T^2 d
  double coupling_fwd_bwd = 0;              // the coupling alone (fused-coupling, aten-coupling)
  double kernel_fwd = 0, kernel_bwd = 0;    // the fused kernels alone (fused-coupling)
  double kernel_fwd_gbs = 0, kernel_bwd_gbs = 0;
};

constexpr double kRopeBase = 10000.0;

Row measure(const Options& o, const std::string& path, const std::string& dtype_name, int64_t T) {
  Row r;
  r.path = path;
  r.dtype = dtype_name;
  r.T = T;
  const bool bf16 = dtype_name == "bf16";
  const auto dtype = bf16 ? at::kBFloat16 : at::kFloat;
  at::manual_seed(T);
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
  auto coupling =
      cqk::QKCoupling(cqk::CouplingOptions(cqk::CouplingKind::Affine, o.heads, o.dim).hidden(o.hidden).steps(o.steps));
  coupling->to(at::kCUDA);
  coupling->train();
  {
    at::NoGradGuard no_grad;
    for (auto& p : coupling->parameters()) p.copy_(at::randn_like(p) * 0.2);
  }
  auto q = at::randn({o.batch, o.heads, T, o.dim}, opts).requires_grad_();
  auto k = at::randn({o.batch, o.heads, T, o.dim}, opts).requires_grad_();
  auto v = at::randn({o.batch, o.heads, T, o.dim}, opts).requires_grad_();
  const auto grad_out = at::randn({o.batch, o.heads, T, o.dim}, opts);
  const auto grad_k = at::randn({o.batch, o.heads, T, o.dim}, opts);
  const auto sdpa = [&](const at::Tensor& a, const at::Tensor& b) {
    return at::scaled_dot_product_attention(a, b, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
  };
  // Undefined gradients, as after zero_grad: the backward writes them without an accumulating add.
  const auto clear_grads = [&] {
    for (auto* t : {&q, &k, &v}) t->mutable_grad().reset();
    for (auto& p : coupling->parameters()) p.mutable_grad().reset();
  };
  const auto time_of = [&](const std::function<void()>& fn) { return time_ms(fn, o.warmup, o.iters, o.calls); };
  // The forward is the training forward (autograd records), so fwd_bwd - fwd is the backward's cost.
  const auto timed = [&](const std::function<at::Tensor()>& forward) {
    return Times{time_of([&] { forward(); }), time_of([&] {
                   clear_grads();
                   forward().backward(grad_out);
                 })};
  };
  const auto coupled_sdpa = [&] {
    const auto [a, b] = coupling->forward(q, k);
    return sdpa(a, b);
  };
  const auto coupling_step = [&] {
    clear_grads();
    auto [a, b] = coupling->forward(q, k);
    torch::autograd::backward({a, b}, {grad_out, grad_k});
  };

  cqk::use_sdpa_backend(path == "sdpa-cudnn" ? cqk::SdpaBackend::CuDnn : cqk::SdpaBackend::Auto);
  r.sdpa_backend = cqk::sdpa_backend_for(o.batch, o.heads, T, o.dim, o.dim, bf16, /*cuda=*/true);
  const bool was_enabled = cqk::fused_coupling_enabled();
  cqk::set_fused_coupling_enabled(path != "aten-coupling");
  if (path == "sdpa" || path == "sdpa-cudnn") {
    r.times = timed([&] { return sdpa(q, k); });
  } else if (path == "rope-sdpa") {
    r.times = timed([&] { return sdpa(cqk::apply_rope(q, kRopeBase), cqk::apply_rope(k, kRopeBase)); });
  } else if (path == "fused-coupling-rope") {
    r.applies = cqk::cuda_affine_coupling_applies(*coupling, q, k);
    if (r.applies) r.times = timed([&] {
        const auto [a, b] = cqk::cuda_affine_coupling(*coupling, q, k, kRopeBase);
        return sdpa(a, b);
      });
  } else {  // fused-coupling, aten-coupling
    r.applies = path == "aten-coupling" || cqk::cuda_affine_coupling_applies(*coupling, q, k);
    if (r.applies) {
      r.times = timed(coupled_sdpa);
      r.coupling_fwd_bwd = time_of(coupling_step);
    }
  }
  if (path == "fused-coupling" && r.applies) {
    // The kernels alone, and the bandwidth they reach: forward reads q, k
    // and writes q', k'; backward reads q', k', dq', dk' and writes dq, dk.
    const double bytes =
        static_cast<double>(o.batch * o.heads * T * o.dim) * static_cast<double>(at::elementSize(dtype));
    const auto options = coupling->options();
    const auto weights = cqk::fused::affine_weights(*coupling);
    const auto qd = q.detach(), kd = k.detach();
    auto q_out = at::empty_like(qd), k_out = at::empty_like(kd), dq = at::empty_like(qd), dk = at::empty_like(kd);
    std::vector<at::Tensor> weight_grads;
    for (const auto& w : weights) weight_grads.push_back(at::zeros_like(w));
    r.kernel_fwd = time_of([&] { cqk::fused::affine_forward_out(options, weights, qd, kd, q_out, k_out); });
    r.kernel_bwd = time_of([&] {
      cqk::fused::affine_backward_out(options, weights, q_out, k_out, grad_out, grad_k, dq, dk, weight_grads);
    });
    r.kernel_fwd_gbs = 4 * bytes / (r.kernel_fwd * 1e-3) / 1e9;
    r.kernel_bwd_gbs = 6 * bytes / (r.kernel_bwd * 1e-3) / 1e9;
  }
  cqk::set_fused_coupling_enabled(was_enabled);
  cqk::use_sdpa_backend(cqk::SdpaBackend::Auto);
  const double pairs = static_cast<double>(o.batch * o.heads) * T * T * o.dim;
  r.fwd_flops = 2.0 * pairs;
  r.fwd_bwd_flops = 7.0 * pairs;
  return r;
}

// One JSON object per row and line, for scripts/gpu_bundle/report.py: times in ms, FLOPs per call.
void print_json(const Options& o, const Row& r) {
  std::printf("{\"path\": \"%s\", \"dtype\": \"%s\", \"T\": %lld, \"batch\": %lld, \"heads\": %lld, \"dim\": %lld, "
              "\"hidden\": %lld, \"steps\": %lld, \"fwd_flops\": %.6g, \"fwd_bwd_flops\": %.6g, \"applies\": %s, "
              "\"fwd_ms\": %.6g, \"fwd_bwd_ms\": %.6g, \"sdpa_backend\": \"%s\"",
              r.path.c_str(), r.dtype.c_str(), static_cast<long long>(r.T), static_cast<long long>(o.batch),
              static_cast<long long>(o.heads), static_cast<long long>(o.dim), static_cast<long long>(o.hidden),
              static_cast<long long>(o.steps), r.fwd_flops, r.fwd_bwd_flops, r.applies ? "true" : "false",
              r.times.fwd, r.times.fwd_bwd, r.sdpa_backend.c_str());
  if (r.path == "fused-coupling" || r.path == "aten-coupling")
    std::printf(", \"coupling_fwd_bwd_ms\": %.6g", r.coupling_fwd_bwd);
  if (r.path == "fused-coupling")
    std::printf(", \"kernel_fwd_ms\": %.6g, \"kernel_fwd_gbs\": %.6g, \"kernel_bwd_ms\": %.6g, \"kernel_bwd_gbs\": %.6g",
                r.kernel_fwd, r.kernel_fwd_gbs, r.kernel_bwd, r.kernel_bwd_gbs);
  std::printf("}\n");
}

void print_markdown_header(const Options& o) {
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  std::printf("\n## Attention path benchmark, %s, %s (%d SMs), torch %s\n", date, prop.name,
              prop.multiProcessorCount, TORCH_VERSION);
  std::printf("batch %lld, heads %lld, head dim %lld, hidden %lld, steps %lld, causal; medians of %d samples of %d "
              "calls; forward+backward ms (TFLOP/s)\n\n",
              static_cast<long long>(o.batch), static_cast<long long>(o.heads), static_cast<long long>(o.dim),
              static_cast<long long>(o.hidden), static_cast<long long>(o.steps), o.iters, o.calls);
  std::printf("| dtype | T |");
  for (const auto& path : o.paths) std::printf(" %s |", path.c_str());
  std::printf(" cuDNN / default SDPA | coupled / base | coupling share | fused coupling alone vs ATen |\n|---|---|");
  for (std::size_t i = 0; i < o.paths.size() + 4; ++i) std::printf("---|");
  std::printf("\n");
}

// One (dtype, T) line over the paths measured; "-" where a path or a ratio is missing.
void print_markdown(const std::vector<Row>& rows) {
  const auto find = [&](const char* path) -> const Row* {
    for (const auto& r : rows)
      if (r.path == path && r.applies && r.times.fwd_bwd > 0) return &r;
    return nullptr;
  };
  const auto ratio = [](double a, double b, const char* format) {
    char s[32];
    std::snprintf(s, sizeof s, format, a / b);
    return std::string(s);
  };
  std::printf("| %s | %lld |", rows.front().dtype.c_str(), static_cast<long long>(rows.front().T));
  for (const auto& r : rows) {
    if (!r.applies) std::printf(" did not apply |");
    else std::printf(" %.3f (%.0f) [%s] |", r.times.fwd_bwd, r.fwd_bwd_flops / (r.times.fwd_bwd * 1e-3) / 1e12,
                     r.sdpa_backend.c_str());
  }
  const Row *sdpa = find("sdpa"), *cudnn = find("sdpa-cudnn"), *base = find("rope-sdpa"),
            *coupled = find("fused-coupling-rope"), *fused = find("fused-coupling"), *aten = find("aten-coupling");
  std::printf(" %s |", sdpa && cudnn ? ratio(cudnn->times.fwd_bwd, sdpa->times.fwd_bwd, "%.2fx").c_str() : "-");
  std::printf(" %s |", base && coupled ? ratio(coupled->times.fwd_bwd, base->times.fwd_bwd, "%.3fx").c_str() : "-");
  std::printf(" %s |", base && coupled
                           ? ratio(coupled->times.fwd_bwd - base->times.fwd_bwd, base->times.fwd_bwd / 100.0, "%.1f%%")
                                 .c_str()
                           : "-");
  std::printf(" %s |\n",
              fused && aten ? ratio(aten->coupling_fwd_bwd, fused->coupling_fwd_bwd, "%.1fx faster").c_str() : "-");
}

void run_bench(const Options& o) {
  if (!o.json) print_markdown_header(o);
  for (const auto& dtype_name : o.dtypes) {
    for (int64_t T : o.times) {
      std::vector<Row> rows;
      for (const auto& path : o.paths) {
        rows.push_back(measure(o, path, dtype_name, T));
        if (o.json) print_json(o, rows.back());
        std::fflush(stdout);
      }
      if (!o.json) print_markdown(rows);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    try {
      if (arg == "--check") o.check = true;
      else if (arg == "--quick") o.quick = true;
      else if (arg == "--bench") o.bench = true;
      else if (arg == "--json") o.json = true;
      else if (arg == "--path") o.paths = known(arg, value(), kPaths);
      else if (arg == "--times") {
        o.times.clear();
        for (const auto& t : split(value())) o.times.push_back(at_least(arg, t, 1));
      } else if (arg == "--batch") o.batch = at_least(arg, value(), 1);
      else if (arg == "--heads") o.heads = at_least(arg, value(), 1);
      else if (arg == "--dim") o.dim = at_least(arg, value(), 1);
      else if (arg == "--hidden") o.hidden = at_least(arg, value(), 1);
      else if (arg == "--steps") o.steps = at_least(arg, value(), 1);
      else if (arg == "--dtypes") o.dtypes = known(arg, value(), kDtypes);
      else if (arg == "--iters") o.iters = static_cast<int>(at_least(arg, value(), 1));
      else if (arg == "--warmup") o.warmup = static_cast<int>(at_least(arg, value(), 0));
      else if (arg == "--calls") o.calls = static_cast<int>(at_least(arg, value(), 1));
      else return usage(argv[0]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cqk_kernel_bench: error: %s\n", e.what());
      return usage(argv[0]);
    }
  }
  if (!o.check && !o.bench) return usage(argv[0]);
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "cqk_kernel_bench: no CUDA device\n");
    return 3;
  }
  if (!cqk::cuda_coupling_built()) {
    std::fprintf(stderr, "cqk_kernel_bench: built without CUDA kernels\n");
    return 3;
  }
  int status = 0;
  try {
    if (o.check) status = run_checks(o.quick);
    if (o.bench) run_bench(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cqk_kernel_bench: %s\n", e.what());
    return 1;
  }
  return status;
}
