#include "bench/coupling_benchmark.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/cuda.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "ops/cpu_coupling.h"
#include "cqk/coupling.h"
#include "ops/cuda_coupling.h"
#include "simd/simd_variants.h"

namespace cqk {

namespace {

using Clock = std::chrono::steady_clock;

void synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

double milliseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

bool kernel_applies(const QKCouplingImpl& coupling, const at::Tensor& q, const at::Tensor& k) {
  if (q.is_cuda()) return cuda_affine_coupling_applies(coupling, q, k);
  // The CPU kernel sees float32: reduced precision is upcast before it.
  return cpu_affine_coupling_applies(coupling, q.to(at::kFloat), k.to(at::kFloat));
}

// The switch restored on every exit, so a failed run leaves the process as it was.
class SwitchScope {
 public:
  SwitchScope() : before_(fused_coupling_enabled()) {}
  ~SwitchScope() { set_fused_coupling_enabled(before_); }

 private:
  bool before_;
};

}  // namespace

CouplingBenchResult benchmark_coupling(const CouplingBenchOptions& o) {
  if (o.batch < 1 || o.heads < 1 || o.time < 1 || o.head_dim < 1 || o.hidden < 1 || o.steps < 1 || o.repeats < 1 ||
      o.rounds < 1)
    throw std::invalid_argument("bench coupling: shape, hidden, steps, repeats and rounds must be positive");
  if (o.dtype != "fp32" && o.dtype != "bf16")
    throw std::invalid_argument("bench coupling: --dtype must be fp32 or bf16, got '" + o.dtype + "'");
  const c10::Device device = [&] {
    try {
      return c10::Device(o.device);
    } catch (const c10::Error&) {
      throw std::invalid_argument("bench coupling: --device: expected cpu or cuda[:N], got '" + o.device + "'");
    }
  }();
  if (device.is_cuda() && !torch::cuda::is_available())
    throw std::invalid_argument("bench coupling: --device " + o.device + " but no CUDA device is available");
  const auto dtype = o.dtype == "bf16" ? at::kBFloat16 : at::kFloat;

  CouplingBenchResult result;
  result.options = o;
  result.device_name = device_name(device);
  result.kernel_variant = device.is_cuda() ? "cuda" : cpu::simd_variant();
  result.threads = at::get_num_threads();

  QKCoupling coupling(CouplingOptions(CouplingKind::Affine, o.heads, o.head_dim).hidden(o.hidden).steps(o.steps));
  {
    at::NoGradGuard no_grad;
    for (auto& p : coupling->parameters()) p.copy_(at::randn_like(p) * 0.1);  // not the identity of init
  }
  coupling->to(device);
  const auto options = at::TensorOptions().device(device).dtype(dtype);
  const auto q = at::randn({o.batch, o.time, o.heads, o.head_dim}, options).transpose(1, 2);
  const auto k = at::randn({o.batch, o.time, o.heads, o.head_dim}, options).transpose(1, 2);
  const auto grad = at::randn({o.batch, o.heads, o.time, o.head_dim}, options);

  SwitchScope restore;
  set_fused_coupling_enabled(true);
  result.kernel.taken = kernel_applies(*coupling, q, k);
  result.aten.taken = true;
  std::vector<double> samples[2][2];  // [kernel, aten][forward, forward+backward]
  for (int64_t round = 0; round < o.rounds; ++round) {
    for (const int path : {0, 1}) {
      set_fused_coupling_enabled(path == 0);
      for (int64_t rep = -1; rep < o.repeats; ++rep) {  // rep -1: warm-up
        synchronize(device);
        auto start = Clock::now();
        {
          at::NoGradGuard no_grad;
          coupling->forward(q, k);
        }
        synchronize(device);
        const double forward = milliseconds_since(start);
        auto qi = q.detach().requires_grad_(true), ki = k.detach().requires_grad_(true);
        start = Clock::now();
        const auto [q_out, k_out] = coupling->forward(qi, ki);
        torch::autograd::backward({q_out, k_out}, {grad, grad});
        synchronize(device);
        const double forward_backward = milliseconds_since(start);
        if (rep < 0) continue;
        samples[path][0].push_back(forward);
        samples[path][1].push_back(forward_backward);
      }
    }
  }
  result.kernel.forward = spread_of(samples[0][0]);
  result.kernel.forward_backward = spread_of(samples[0][1]);
  result.aten.forward = spread_of(samples[1][0]);
  result.aten.forward_backward = spread_of(samples[1][1]);
  return result;
}

std::string describe(const CouplingBenchResult& r) {
  const auto& o = r.options;
  std::ostringstream out;
  out.precision(3);
  out << std::fixed;
  out << "coupling    affine, q and k [" << o.batch << ", " << o.heads << ", " << o.time << ", " << o.head_dim
      << "], hidden " << o.hidden << ", " << o.steps << " steps, " << o.dtype << "\n"
      << "device      " << o.device << " (" << r.device_name << "), " << r.threads << " threads | " << o.rounds
      << " rounds x " << o.repeats << " repetitions per path\n";
  const auto line = [&](const char* name, const CouplingPathTiming& t) {
    out << name << "forward median " << t.forward.median << " ms (min " << t.forward.min
        << ") | forward+backward median " << t.forward_backward.median << " ms (min " << t.forward_backward.min
        << ")\n";
  };
  if (!r.kernel.taken)
    out << "kernel      not taken for these inputs (see docs/KERNELS.md for what it covers); both rows are ATen\n";
  line(("kernel      " + r.kernel_variant + ": ").c_str(), r.kernel);
  line("aten        ", r.aten);
  out << "aten/kernel forward " << r.aten.forward.median / r.kernel.forward.median << "x | forward+backward "
      << r.aten.forward_backward.median / r.kernel.forward_backward.median << "x (ratio of medians)\n";
  return out.str();
}

std::string to_json(const CouplingBenchResult& r) {
  const auto& o = r.options;
  const auto spread = [](const Spread& s) {
    return nlohmann::json{{"median", s.median}, {"min", s.min}, {"max", s.max}, {"p25", s.p25}, {"p75", s.p75}};
  };
  const auto path = [&](const CouplingPathTiming& t) {
    return nlohmann::json{{"taken", t.taken}, {"forward_ms", spread(t.forward)},
                          {"forward_backward_ms", spread(t.forward_backward)}};
  };
  return nlohmann::json{{"shape", {o.batch, o.heads, o.time, o.head_dim}},
                        {"hidden", o.hidden},
                        {"steps", o.steps},
                        {"dtype", o.dtype},
                        {"device", o.device},
                        {"device_name", r.device_name},
                        {"threads", r.threads},
                        {"kernel_variant", r.kernel_variant},
                        {"rounds", o.rounds},
                        {"repeats", o.repeats},
                        {"kernel", path(r.kernel)},
                        {"aten", path(r.aten)}}
      .dump();
}

}  // namespace cqk
