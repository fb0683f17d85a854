// cqk_kernel_bench: GPU checks and timings of the fused affine coupling and of
// the flash coupled attention.
//
//   cqk_kernel_bench --check [--quick] the checks of tests/fused_coupling_test.cpp
//                                      (tools/fused_check.h); exit 1 on failure;
//                                      --quick: the small cases only (for compute-sanitizer)
//   cqk_kernel_bench --bench [options] forward and forward+backward timings, a markdown table:
//       --times 512,1024,2048 --batch 8 --heads 12 --dim 64 --hidden 8 --steps 2
//       --dtypes bf16,fp32 --iters 20 --warmup 5
//       --json: one JSON object per row instead (scripts/gpu_bundle/run.sh)
//
// Rows per (dtype, T): SDPA alone (causal, no coupling); the ATen coupling +
// SDPA; the fused coupling + SDPA; the coupling alone, ATen and fused; the
// fused kernels alone with their achieved memory bandwidth; the flash coupled
// attention (coupling + RoPE + attention in one kernel per pass); the same for
// differential attention (heads / 2 heads of two pairs, values of 2 * dim,
// both maps in one launch) against its default path (coupling, RoPE, one SDPA
// per pair). The default paths couple and rotate as cqk::Attention does: in
// the fused coupling kernel where it applies. Times are medians
// of per-iteration CUDA-event times; TFLOP/s counts attention's causal
// FLOPs (forward 2 B H T^2 d, forward+backward 7 B H T^2 d) for every path
// that includes attention. The forward alone is the training forward
// (autograd records), so forward+backward minus forward is the backward.
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
#include "cqk/fused_attention.h"
#include "cqk/fused_coupling.h"
#include "cqk/rope.h"
#include "tools/fused_check.h"

namespace {

struct Options {
  bool check = false, bench = false, quick = false, json = false;
  std::vector<int64_t> times{512, 1024, 2048};
  int64_t batch = 8, heads = 12, dim = 64, hidden = 8, steps = 2;
  std::vector<std::string> dtypes{"bf16", "fp32"};
  int iters = 20, warmup = 5;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> parts;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, ',');)
    if (!part.empty()) parts.push_back(part);
  return parts;
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--check [--quick]] [--bench [--json]] [--times 512,1024,2048] [--batch 8] [--heads 12] [--dim 64]\n"
               "          [--hidden 8] [--steps 2] [--dtypes bf16,fp32] [--iters 20] [--warmup 5]\n",
               argv0);
  return 2;
}

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// Median milliseconds of fn() over iters runs, after warmup runs.
double time_ms(const std::function<void()>& fn, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn();
  check_cuda(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  const auto stream = c10::cuda::getCurrentCUDAStream().stream();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    check_cuda(cudaEventRecord(start, stream), "cudaEventRecord");
    fn();
    check_cuda(cudaEventRecord(stop, stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float elapsed = 0;
    check_cuda(cudaEventElapsedTime(&elapsed, start, stop), "cudaEventElapsedTime");
    ms.push_back(elapsed);
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
  for (const auto& c : cqk::fused_check::attention_cases()) {
    if (quick && c.time > 100) continue;
    for (bool rope : {true, false}) {
      const auto r = cqk::fused_check::check_coupled_attention(c, seed++, rope);
      std::printf("%s flash    %-48s worst rel err %.3g\n", r.ok ? "PASS" : "FAIL",
                  (c.name() + (rope ? " rope" : " no rope")).c_str(), r.worst);
      if (!r.ok) std::printf("%s", r.report.c_str()), ++failures;
    }
  }
  std::printf("checks: %d failed\n", failures);
  return failures == 0 ? 0 : 1;
}

// The coupling and RoPE of the attention's default (non-flash) path: one
// fused kernel where it applies, as the q/k path (src/ops/qk_path.h) does.
std::pair<at::Tensor, at::Tensor> coupled_and_rotated(cqk::QKCoupling& coupling, const at::Tensor& q,
                                                      const at::Tensor& k) {
  constexpr double kBase = 10000.0;
  if (cqk::fused_affine_coupling_applies(*coupling, q, k)) return cqk::fused_affine_coupling(*coupling, q, k, kBase);
  const auto [a, b] = coupling->forward(q, k);
  return {cqk::apply_rope(a, kBase), cqk::apply_rope(b, kBase)};
}

// Differential attention's two maps, forward+backward, with the same total
// q/k heads as the vanilla rows (heads / 2 heads of two pairs, one coupling
// per head shared by the pairs, values of 2 * dim): the default path (the
// coupling with the pairs folded into the batch, RoPE, one SDPA per pair)
// and the flash kernel (0 when it does not apply).
std::pair<double, double> time_differential(const Options& o, int64_t T, at::ScalarType dtype) {
  if (o.heads < 2 || o.heads % 2 != 0) return {0.0, 0.0};  // differential heads are pairs of q/k heads
  const int64_t heads = o.heads / 2;
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
  auto coupling =
      cqk::QKCoupling(cqk::CouplingOptions(cqk::CouplingKind::Affine, heads, o.dim).hidden(o.hidden).steps(o.steps));
  coupling->to(at::kCUDA);
  {
    at::NoGradGuard no_grad;
    for (auto& p : coupling->parameters()) p.copy_(at::randn_like(p) * 0.2);
  }
  auto q = at::randn({o.batch, 2, heads, T, o.dim}, opts).requires_grad_();
  auto k = at::randn({o.batch, 2, heads, T, o.dim}, opts).requires_grad_();
  auto v = at::randn({o.batch, heads, T, 2 * o.dim}, opts).requires_grad_();
  const auto grad_out = at::randn({o.batch, 2, heads, T, 2 * o.dim}, opts);
  const auto default_step = [&] {
    const auto folded = [&](const at::Tensor& t) { return t.reshape({o.batch * 2, heads, T, o.dim}); };
    auto [a, b] = coupled_and_rotated(coupling, folded(q), folded(k));
    a = a.reshape(q.sizes());
    b = b.reshape(k.sizes());
    std::vector<at::Tensor> maps;
    for (int64_t p = 0; p < 2; ++p)
      maps.push_back(at::scaled_dot_product_attention(a.select(1, p), b.select(1, p), v, /*attn_mask=*/{},
                                                      /*dropout_p=*/0.0, /*is_causal=*/true));
    at::stack(maps, 1).backward(grad_out);
  };
  const auto flash_step = [&] { cqk::fused_paired_coupled_attention(*coupling, q, k, v, 10000.0).backward(grad_out); };
  const bool was_enabled = cqk::fused_attention_enabled();
  cqk::set_fused_attention_enabled(true);  // applies() asks the switch; the timing calls the path directly
  const bool flash = cqk::fused_paired_coupled_attention_applies(*coupling, q, k, v);
  cqk::set_fused_attention_enabled(was_enabled);
  return {time_ms(default_step, o.warmup, o.iters), flash ? time_ms(flash_step, o.warmup, o.iters) : 0.0};
}

// Median milliseconds of one path, forward alone and forward+backward.
struct Times {
  double fwd = 0, fwd_bwd = 0;
};

// One (dtype, T) row of the table; 0 where a path does not apply.
struct Row {
  std::string dtype;
  int64_t T = 0;
  Times sdpa, aten, fused, flash, default_rope;  // default_rope: fused coupling + RoPE + SDPA, flash's baseline
  bool fused_applies = false, flash_applies = false;
  double coupling_aten = 0, coupling_fused = 0;  // the coupling alone, forward+backward
  double kernel_fwd = 0, kernel_bwd = 0;         // the fused kernels alone
  double kernel_fwd_gbs = 0, kernel_bwd_gbs = 0;
  double diff_default = 0, diff_flash = 0;       // differential attention, forward+backward
  double fwd_flops = 0, fwd_bwd_flops = 0;       // causal attention: 2 and 7 B H T^2 d
};

Row measure_row(const Options& o, const std::string& dtype_name, int64_t T) {
  Row r;
  r.dtype = dtype_name;
  r.T = T;
  const auto dtype = dtype_name == "bf16" ? at::kBFloat16 : at::kFloat;
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
  // The forward is the training forward (autograd records), so fwd_bwd - fwd is the backward's cost.
  const auto timed = [&](const std::function<at::Tensor()>& forward) {
    return Times{time_ms([&] { forward(); }, o.warmup, o.iters),
                 time_ms([&] { forward().backward(grad_out); }, o.warmup, o.iters)};
  };
  const auto coupled_sdpa = [&] {
    const auto [a, b] = coupling->forward(q, k);
    return sdpa(a, b);
  };
  const auto coupling_step = [&] {
    auto [a, b] = coupling->forward(q, k);
    torch::autograd::backward({a, b}, {grad_out, grad_k});
  };
  const bool was_enabled = cqk::fused_coupling_enabled();
  r.sdpa = timed([&] { return sdpa(q, k); });
  cqk::set_fused_coupling_enabled(false);
  r.aten = timed(coupled_sdpa);
  r.coupling_aten = time_ms(coupling_step, o.warmup, o.iters);
  cqk::set_fused_coupling_enabled(true);
  r.fused_applies = cqk::fused_affine_coupling_applies(*coupling, q, k);
  r.fused = timed(coupled_sdpa);
  r.coupling_fused = time_ms(coupling_step, o.warmup, o.iters);
  cqk::set_fused_coupling_enabled(was_enabled);

  // The kernels alone, and the bandwidth they reach: forward reads q, k
  // and writes q', k'; backward reads q', k', dq', dk' and writes dq, dk.
  const double bytes = static_cast<double>(o.batch * o.heads * T * o.dim) * static_cast<double>(at::elementSize(dtype));
  if (r.fused_applies) {
    const auto options = coupling->options();
    const auto weights = cqk::fused::affine_weights(*coupling);
    const auto qd = q.detach(), kd = k.detach();
    auto q_out = at::empty_like(qd), k_out = at::empty_like(kd), dq = at::empty_like(qd), dk = at::empty_like(kd);
    std::vector<at::Tensor> weight_grads;
    for (const auto& w : weights) weight_grads.push_back(at::zeros_like(w));
    r.kernel_fwd =
        time_ms([&] { cqk::fused::affine_forward_out(options, weights, qd, kd, q_out, k_out); }, o.warmup, o.iters);
    r.kernel_bwd = time_ms(
        [&] {
          cqk::fused::affine_backward_out(options, weights, q_out, k_out, grad_out, grad_k, dq, dk, weight_grads);
        },
        o.warmup, o.iters);
    r.kernel_fwd_gbs = 4 * bytes / (r.kernel_fwd * 1e-3) / 1e9;
    r.kernel_bwd_gbs = 6 * bytes / (r.kernel_bwd * 1e-3) / 1e9;
  }
  // The flash kernel against the default path for the same work (coupling, RoPE, attention).
  const bool flash_was_enabled = cqk::fused_attention_enabled();
  cqk::set_fused_attention_enabled(true);  // applies() asks the switch; the timing calls the path directly
  r.flash_applies = cqk::fused_coupled_attention_applies(*coupling, q, k, v);
  cqk::set_fused_attention_enabled(flash_was_enabled);
  r.default_rope = timed([&] {
    const auto [a, b] = coupled_and_rotated(coupling, q, k);
    return sdpa(a, b);
  });
  if (r.flash_applies) r.flash = timed([&] { return cqk::fused_coupled_attention(*coupling, q, k, v, 10000.0); });
  std::tie(r.diff_default, r.diff_flash) = time_differential(o, T, dtype);
  const double pairs = static_cast<double>(o.batch * o.heads) * T * T * o.dim;
  r.fwd_flops = 2.0 * pairs;
  r.fwd_bwd_flops = 7.0 * pairs;
  return r;
}

void print_markdown_header(const Options& o) {
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  std::printf("\n## Fused coupling benchmark, %s, %s (%d SMs), torch %s\n", date, prop.name,
              prop.multiProcessorCount, TORCH_VERSION);
  std::printf("batch %lld, heads %lld, head dim %lld, hidden %lld, steps %lld, causal; medians of %d (ms); "
              "TFLOP/s of forward+backward\n\n",
              static_cast<long long>(o.batch), static_cast<long long>(o.heads), static_cast<long long>(o.dim),
              static_cast<long long>(o.hidden), static_cast<long long>(o.steps), o.iters);
  std::printf("| dtype | T | SDPA fwd | SDPA fwd+bwd | TFLOP/s | ATen coupling + SDPA fwd | fwd+bwd | TFLOP/s | "
              "fused coupling + SDPA fwd | fwd+bwd | TFLOP/s | fused / SDPA | fused vs ATen (total) | coupling ATen | "
              "coupling fused | coupling speedup | fused fwd kernel (GB/s) | fused bwd kernel (GB/s) | flash coupled "
              "attention + RoPE fwd | fwd+bwd | TFLOP/s | flash / (fused coupling + RoPE + SDPA) | diff: default path "
              "| diff: flash | diff: flash / default |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
}

void print_markdown(const Row& r) {
  const auto tflops = [&](double ms) { return ms > 0 ? r.fwd_bwd_flops / (ms * 1e-3) / 1e12 : 0.0; };
  std::printf("| %s | %lld | %.3f | %.3f | %.0f | %.3f | %.3f | %.0f | %.3f | %.3f%s | %.0f | %.2fx | %.2fx faster | "
              "%.3f | %.3f | %.1fx | %.3f (%.0f) | %.3f (%.0f) | %.3f | %.3f%s | %.0f | %.2fx | %.3f | %.3f%s | %.2fx |\n",
              r.dtype.c_str(), static_cast<long long>(r.T), r.sdpa.fwd, r.sdpa.fwd_bwd, tflops(r.sdpa.fwd_bwd),
              r.aten.fwd, r.aten.fwd_bwd, tflops(r.aten.fwd_bwd), r.fused.fwd, r.fused.fwd_bwd,
              r.fused_applies ? "" : " (ATen!)", tflops(r.fused.fwd_bwd), r.fused.fwd_bwd / r.sdpa.fwd_bwd,
              r.aten.fwd_bwd / r.fused.fwd_bwd, r.coupling_aten, r.coupling_fused, r.coupling_aten / r.coupling_fused,
              r.kernel_fwd, r.kernel_fwd_gbs, r.kernel_bwd, r.kernel_bwd_gbs, r.flash.fwd, r.flash.fwd_bwd,
              r.flash_applies ? "" : " (n/a)", tflops(r.flash.fwd_bwd),
              r.flash_applies ? r.flash.fwd_bwd / r.default_rope.fwd_bwd : 0.0, r.diff_default, r.diff_flash,
              r.diff_flash > 0 ? "" : " (n/a)", r.diff_flash > 0 ? r.diff_flash / r.diff_default : 0.0);
}

// One JSON object per row and line, for scripts/gpu_bundle/report.py: times in ms, FLOPs per call.
void print_json(const Options& o, const Row& r) {
  const auto times = [](const Times& t) {
    char s[96];
    std::snprintf(s, sizeof s, "{\"fwd_ms\": %.6g, \"fwd_bwd_ms\": %.6g}", t.fwd, t.fwd_bwd);
    return std::string(s);
  };
  std::printf("{\"dtype\": \"%s\", \"T\": %lld, \"batch\": %lld, \"heads\": %lld, \"dim\": %lld, \"hidden\": %lld, "
              "\"steps\": %lld, \"fwd_flops\": %.6g, \"fwd_bwd_flops\": %.6g, \"sdpa\": %s, \"aten_coupling_sdpa\": %s, "
              "\"fused_coupling_sdpa\": %s, \"fused_applies\": %s, \"flash_coupled_attention\": %s, "
              "\"flash_applies\": %s, \"fused_coupling_rope_sdpa\": %s, \"coupling_aten_fwd_bwd_ms\": %.6g, "
              "\"coupling_fused_fwd_bwd_ms\": %.6g, \"kernel_fwd_ms\": %.6g, \"kernel_fwd_gbs\": %.6g, "
              "\"kernel_bwd_ms\": %.6g, \"kernel_bwd_gbs\": %.6g, \"diff_default_fwd_bwd_ms\": %.6g, "
              "\"diff_flash_fwd_bwd_ms\": %.6g}\n",
              r.dtype.c_str(), static_cast<long long>(r.T), static_cast<long long>(o.batch),
              static_cast<long long>(o.heads), static_cast<long long>(o.dim), static_cast<long long>(o.hidden),
              static_cast<long long>(o.steps), r.fwd_flops, r.fwd_bwd_flops, times(r.sdpa).c_str(),
              times(r.aten).c_str(), times(r.fused).c_str(), r.fused_applies ? "true" : "false",
              times(r.flash).c_str(), r.flash_applies ? "true" : "false", times(r.default_rope).c_str(),
              r.coupling_aten, r.coupling_fused, r.kernel_fwd, r.kernel_fwd_gbs, r.kernel_bwd, r.kernel_bwd_gbs,
              r.diff_default, r.diff_flash);
}

void run_bench(const Options& o) {
  if (!o.json) print_markdown_header(o);
  for (const auto& dtype_name : o.dtypes) {
    for (int64_t T : o.times) {
      const Row r = measure_row(o, dtype_name, T);
      o.json ? print_json(o, r) : print_markdown(r);
      std::fflush(stdout);
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
      else if (arg == "--times") {
        o.times.clear();
        for (const auto& t : split(value())) o.times.push_back(std::stoll(t));
      } else if (arg == "--batch") o.batch = std::stoll(value());
      else if (arg == "--heads") o.heads = std::stoll(value());
      else if (arg == "--dim") o.dim = std::stoll(value());
      else if (arg == "--hidden") o.hidden = std::stoll(value());
      else if (arg == "--steps") o.steps = std::stoll(value());
      else if (arg == "--dtypes") o.dtypes = split(value());
      else if (arg == "--iters") o.iters = std::stoi(value());
      else if (arg == "--warmup") o.warmup = std::stoi(value());
      else return usage(argv[0]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return usage(argv[0]);
    }
  }
  if (!o.check && !o.bench) return usage(argv[0]);
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "cqk_kernel_bench: no CUDA device\n");
    return 3;
  }
  if (!cqk::fused_coupling_built()) {
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
