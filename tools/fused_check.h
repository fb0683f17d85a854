#pragma once
// GPU checks of the fused affine coupling against the ATen path, shared by the
// GoogleTest suite (tests/fused_coupling_test.cpp) and the standalone
// cqk_kernel_bench --check (which scripts/gpu_check.sh runs where GoogleTest and
// the other dependencies of the full build are missing). Host-side torch code:
// unlike the rest of kernels/, this header includes torch.
//
// Each check draws fresh random weights and inputs, runs the fused kernels into
// NaN-poisoned outputs (an element the kernel fails to write stays NaN and
// fails the check) and compares with the ATen coupling in float64 by
// max |fused - reference| / max(max |reference|, 1e-2) per tensor, as the
// emulation tests do.
#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "cqk/coupling.h"
#include "ops/cuda_coupling.h"
#include "cqk/rope.h"
#include "check_support.h"
#include "tensor_compare.h"

namespace cqk::fused_check {

struct Case {
  int64_t batch = 2, heads = 3, time = 37, head_dim = 64, hidden = 8, steps = 2;
  bool shared = false;
  at::ScalarType dtype = at::kFloat;
  bool strided = false;           // q, k as [batch, time, heads, d] transposed: non-contiguous rows
  int64_t tokens_per_block = 0;   // > 0: forces CQK_FUSED_TOKENS_PER_BLOCK (several batches per block)
  bool qk_norm = false;           // the coupling kernels also apply QK-norm (random weights, eps kNormEps)...
  bool rope = false;              // ... and RoPE (base kRopeBase) to their outputs

  std::string name() const {
    std::ostringstream s;
    s << (dtype == at::kBFloat16 ? "bf16" : "fp32") << " B" << batch << " H" << heads << " T" << time << " D"
      << head_dim << " R" << hidden << " S" << steps << (shared ? " shared" : " per-head")
      << (strided ? " strided" : "");
    if (tokens_per_block > 0) s << " tpb" << tokens_per_block;
    if (qk_norm) s << " qk-norm";
    if (rope) s << " rope";
    return s.str();
  }
  CouplingOptions options() const {
    return CouplingOptions(CouplingKind::Affine, heads, head_dim)
        .hidden(hidden)
        .steps(steps)
        .shared_across_heads(shared);
  }
  // The coupling kernels' tolerances: those of the emulation tests
  // (tests/kernel_emulation/fused_coupling_emulation_test.cpp), about 3x the
  // largest errors the emulator measured running the same kernel code on the
  // CPU (2026-12-03: fp32 5.4e-7 forward, 2.6e-6 gradients, 2.2e-6 inverse;
  // bf16 2.4e-3, 1.4e-2, 1.4e-2). The GPU runs the same float32 operations:
  // FMA contraction, exp's last bit and the order of the atomic sums (which the
  // emulator varies too) should stay well inside that margin, which the first
  // GPU run (scripts/gpu_check.sh) is to confirm.
  // Beyond 5 steps the inverse's rounding is amplified step by step, and with
  // it the backward, which rebuilds its inputs by the inverse: the emulator
  // measured 1.0e-3 (gradients) and 4.5e-4 (inverse) at 8 steps, with weights
  // larger than randomise()'s.
  double forward_tolerance() const { return dtype == at::kBFloat16 ? 8e-3 : 2e-6; }
  double gradient_tolerance() const { return dtype == at::kBFloat16 ? 4e-2 : steps > 5 ? 3e-3 : 1e-5; }
  double inverse_tolerance() const { return dtype == at::kBFloat16 ? 3e-2 : steps > 5 ? 1.5e-3 : 6e-6; }
};

constexpr double kRopeBase = 10000.0;
constexpr double kNormEps = 1e-5;

struct Result {
  bool ok = true;
  std::string report;  // one line per comparison, failures marked
  double worst = 0.0;  // largest relative error seen
};

// The cases the GPU tests and gpu_check.sh run.
inline std::vector<Case> standard_cases() {
  std::vector<Case> cases;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    Case c;
    c.dtype = dtype;
    cases.push_back(c);  // odd time, per-head, 2 steps
    Case shared = c;
    shared.shared = true;
    shared.steps = 4;
    shared.time = 1;
    shared.batch = 3;
    cases.push_back(shared);  // one token per (batch, head), shared weights
    Case wide = c;
    wide.head_dim = 128;
    wide.time = 129;
    cases.push_back(wide);
    Case hidden16 = c;
    hidden16.hidden = 16;
    hidden16.steps = 3;
    hidden16.time = 65;
    hidden16.shared = true;
    cases.push_back(hidden16);
    Case wide16 = c;
    wide16.head_dim = 128;
    wide16.hidden = 16;
    wide16.time = 31;
    cases.push_back(wide16);
    Case strided = c;
    strided.strided = true;
    strided.time = 45;
    cases.push_back(strided);
    Case chunked = c;  // several token batches per block, several blocks per head
    chunked.time = 333;
    chunked.tokens_per_block = 96;
    cases.push_back(chunked);
    Case chunked_shared = chunked;
    chunked_shared.shared = true;
    chunked_shared.head_dim = 128;
    chunked_shared.tokens_per_block = 48;
    cases.push_back(chunked_shared);
    Case large = c;  // the heuristic's own choice at a realistic size
    large.batch = 4;
    large.heads = 4;
    large.time = 2049;
    cases.push_back(large);
    Case rotated = strided;  // coupling + RoPE, as the attention calls it
    rotated.rope = true;
    cases.push_back(rotated);
    Case rotated_wide = wide;
    rotated_wide.rope = true;
    rotated_wide.tokens_per_block = 48;
    cases.push_back(rotated_wide);
    Case rotated_shared = shared;  // RoPE with weights shared across heads, one token per row
    rotated_shared.rope = true;
    cases.push_back(rotated_shared);
    Case normed = rotated;  // coupling + QK-norm + RoPE: the QKNorm attention
    normed.qk_norm = true;
    cases.push_back(normed);
    Case normed_wide = wide16;  // QK-norm without RoPE, several batches per block
    normed_wide.qk_norm = true;
    normed_wide.tokens_per_block = 48;
    cases.push_back(normed_wide);
    // Every step count the launchers take (1..AffineCouplingParams::kMaxSteps): 2-4 are above.
    for (const int64_t steps : {1, 5, 6, 7, 8}) {
      Case stepped = c;
      stepped.steps = steps;
      stepped.time = 19 + steps;
      cases.push_back(stepped);
    }
    Case product = rotated;  // the kernel table's shape of the product path: coupling + RoPE, T = 1024
    product.batch = 2;
    product.heads = 4;
    product.time = 1024;
    cases.push_back(product);
  }
  return cases;
}

namespace detail {

// The largest |reference| below which errors count as absolute, as in the
// emulation tests: a reference can be exactly zero (the q and k gradients of
// attention over a single token) where the kernel leaves float32 rounding.
constexpr double kReferenceFloor = 1e-2;

inline double relative_error(const at::Tensor& actual, const at::Tensor& expected) {
  if (actual.isnan().any().item<bool>()) return std::numeric_limits<double>::infinity();
  return testing::max_relative_error(actual, expected, kReferenceFloor);
}

inline void compare(Result& result, const std::string& what, const at::Tensor& actual, const at::Tensor& expected,
                    double tolerance) {
  std::ostringstream line;
  if (!actual.defined() || !expected.defined() || actual.sizes() != expected.sizes()) {
    result.ok = false;
    line << "FAIL " << what << ": missing or misshapen";
  } else {
    const int64_t nans = actual.isnan().sum().item<int64_t>();
    const double err = relative_error(actual, expected);
    result.worst = std::max(result.worst, err);
    const bool ok = nans == 0 && err <= tolerance;
    result.ok = result.ok && ok;
    line << (ok ? "ok   " : "FAIL ") << what << ": rel err " << err << " (tol " << tolerance << ")";
    if (nans > 0) line << ", " << nans << " NaN (unwritten?)";
  }
  result.report += line.str() + "\n";
}

// Random weights of scale 0.15 sqrt(64 / D): log-scales s of order +-0.5, a
// clearly non-trivial map whose float32 inverse still loses only ~1e-6 over four
// steps (at 0.2 the rebuilt inputs already drift by 5e-5 from float64: that is
// the conditioning of the map, not the kernels, and the fp32 tolerance is 1e-5).
inline void randomise(QKCoupling& coupling) {
  at::NoGradGuard no_grad;
  const double scale = 0.15 * std::sqrt(64.0 / static_cast<double>(coupling->options().head_dim()));
  for (auto& p : coupling->parameters()) p.copy_(at::randn_like(p) * scale);
}

// [b, h, t, dim] of `dtype` on the GPU: contiguous, or a transposed view of [b, t, h, dim].
inline at::Tensor input(const Case& c) {
  const auto options = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  if (c.strided) return at::randn({c.batch, c.time, c.heads, c.head_dim}, options).to(c.dtype).transpose(1, 2);
  return at::randn({c.batch, c.heads, c.time, c.head_dim}, options).to(c.dtype);
}

// A coupling on the GPU with random weights (randomise), and its float64 copy for the reference.
inline QKCoupling random_coupling(const CouplingOptions& options) {
  QKCoupling coupling(options);
  coupling->to(at::kCUDA);
  randomise(coupling);
  return coupling;
}

inline QKCoupling float64_copy(const QKCoupling& coupling) {
  QKCoupling copy(coupling->options());
  {
    at::NoGradGuard no_grad;
    auto dst = copy->parameters();
    const auto src = coupling->parameters();
    for (size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
  }
  copy->to(at::kCUDA, at::kDouble);
  return copy;
}

}  // namespace detail

// The fused forward, inverse and backward launchers against autograd of the
// ATen coupling (then RMSNorm and apply_rope, for c.qk_norm and c.rope) in
// float64, on fresh random inputs, outputs poisoned with NaN.
inline Result check_kernels(const Case& c, uint64_t seed) {
  using namespace detail;
  Result result;
  at::manual_seed(seed);
  const TokensPerBlock tokens_per_block(c.tokens_per_block);
  const auto options = c.options();
  QKCoupling coupling = random_coupling(options);
  QKCoupling reference = float64_copy(coupling);

  const auto q = input(c), k = input(c);
  auto q_ref = q.to(at::kDouble).requires_grad_(), k_ref = k.to(at::kDouble).requires_grad_();
  auto [q_out_ref, k_out_ref] = reference->transform(q_ref, k_ref);  // plain autograd, never the fused path
  fused::AfterCoupling after;
  at::Tensor q_norm_ref, k_norm_ref;  // float64 copies of the norm weights, for their gradients
  const auto q_coupled_ref = q_out_ref.detach(), k_coupled_ref = k_out_ref.detach();
  if (c.qk_norm) {
    after.q_norm_weight = 1.0 + 0.3 * at::randn({c.head_dim}, q.options().dtype(at::kFloat));
    after.k_norm_weight = 1.0 + 0.3 * at::randn({c.head_dim}, q.options().dtype(at::kFloat));
    after.norm_eps = kNormEps;
    after.q_coupled = poisoned(q.contiguous());
    after.k_coupled = poisoned(k.contiguous());
    q_norm_ref = after.q_norm_weight.to(at::kDouble).requires_grad_();
    k_norm_ref = after.k_norm_weight.to(at::kDouble).requires_grad_();
    const auto rms_norm = [](const at::Tensor& x, const at::Tensor& w) {
      return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + kNormEps) * w;
    };
    q_out_ref = rms_norm(q_out_ref, q_norm_ref);
    k_out_ref = rms_norm(k_out_ref, k_norm_ref);
  }
  if (c.rope) {
    q_out_ref = apply_rope(q_out_ref, kRopeBase);
    k_out_ref = apply_rope(k_out_ref, kRopeBase);
    std::tie(after.rope_cos, after.rope_sin) = rope_tables(c.time, c.head_dim, kRopeBase, q.device());
  }

  const auto weights = fused::affine_weights(*coupling);
  auto q_out = poisoned(q), k_out = poisoned(k);
  fused::affine_forward_out(options, weights, q, k, q_out, k_out, /*inverse=*/false, after);
  compare(result, "forward q", q_out, q_out_ref, c.forward_tolerance());
  compare(result, "forward k", k_out, k_out_ref, c.forward_tolerance());
  if (c.qk_norm) {  // the coupling's own outputs, kept for the backward
    compare(result, "coupled q", after.q_coupled, q_coupled_ref, c.forward_tolerance());
    compare(result, "coupled k", after.k_coupled, k_coupled_ref, c.forward_tolerance());
  }

  if (!c.rope && !c.qk_norm) {
    // The inverse launcher rebuilds the inputs (in bf16 from rounded outputs: bf16 accuracy).
    auto q_back = poisoned(q), k_back = poisoned(k);
    fused::affine_forward_out(options, weights, q_out, k_out, q_back, k_back, /*inverse=*/true);
    compare(result, "inverse q", q_back, q, c.inverse_tolerance());
    compare(result, "inverse k", k_back, k, c.inverse_tolerance());
  }

  // Backward from the fused outputs, as in training.
  const auto grad_q = input(c), grad_k = input(c);
  torch::autograd::backward({q_out_ref, k_out_ref}, {grad_q.to(at::kDouble), grad_k.to(at::kDouble)});
  auto dq = poisoned(q), dk = poisoned(k);
  std::vector<at::Tensor> weight_grads;
  for (const auto& w : weights) weight_grads.push_back(at::zeros_like(w));
  if (c.qk_norm) {
    after.q_norm_weight_grad = at::zeros_like(after.q_norm_weight);
    after.k_norm_weight_grad = at::zeros_like(after.k_norm_weight);
  }
  // With QK-norm the backward reads the coupling's own outputs, as in training.
  const auto& q_saved = c.qk_norm ? after.q_coupled : q_out;
  const auto& k_saved = c.qk_norm ? after.k_coupled : k_out;
  fused::affine_backward_out(options, weights, q_saved, k_saved, grad_q, grad_k, dq, dk, weight_grads, after);
  compare(result, "dq", dq, q_ref.grad(), c.gradient_tolerance());
  compare(result, "dk", dk, k_ref.grad(), c.gradient_tolerance());
  if (c.qk_norm) {
    compare(result, "d q_norm.weight", after.q_norm_weight_grad, q_norm_ref.grad(), c.gradient_tolerance());
    compare(result, "d k_norm.weight", after.k_norm_weight_grad, k_norm_ref.grad(), c.gradient_tolerance());
  }
  const auto ref_params = reference->named_parameters();
  for (int64_t s = 0; s < c.steps; ++s) {
    const char* names[] = {"w1", "b1", "w2", "b2"};
    for (int j = 0; j < 4; ++j) {
      const std::string key = "conditioner" + std::to_string(s) + "." + names[j];
      // Weight gradients are float32 sums over tokens in both dtypes; in bf16
      // they inherit the inputs' rounding, hence the bf16 tolerance there.
      compare(result, "d" + key, weight_grads[4 * s + j], ref_params[key].grad(), c.gradient_tolerance());
    }
  }
  return result;
}

// QKCoupling::forward on CUDA takes the fused path (src/ops/qk_path.h) (with the switch on) and
// gives the ATen path's outputs and gradients (switch off).
inline Result check_module_dispatch(const Case& c, uint64_t seed) {
  using namespace detail;
  Result result;
  at::manual_seed(seed);
  const TokensPerBlock tokens_per_block(c.tokens_per_block);
  QKCoupling coupling(c.options());
  coupling->to(at::kCUDA);
  coupling->train();
  randomise(coupling);
  const auto q0 = input(c), k0 = input(c), gq = input(c), gk = input(c);
  std::vector<at::Tensor> grads[2], outs[2];
  const bool was_enabled = fused_coupling_enabled();
  for (int fused_path = 0; fused_path < 2; ++fused_path) {
    set_fused_coupling_enabled(fused_path == 1);
    if (cuda_affine_coupling_applies(*coupling, q0, k0) != (fused_path == 1)) {
      result.ok = false;
      result.report += std::string("FAIL cuda_affine_coupling_applies() is ") +
                       (fused_path == 1 ? "false with the switch on\n" : "true with the switch off\n");
    }
    for (auto& p : coupling->parameters()) p.mutable_grad() = at::Tensor();
    auto q = q0.detach().requires_grad_(), k = k0.detach().requires_grad_();
    auto [q_out, k_out] = coupling->forward(q, k);
    torch::autograd::backward({q_out, k_out}, {gq, gk});
    outs[fused_path] = {q_out.detach(), k_out.detach()};
    grads[fused_path] = {q.grad(), k.grad()};
    for (const auto& p : coupling->parameters()) grads[fused_path].push_back(p.grad());
  }
  set_fused_coupling_enabled(was_enabled);
  // Both paths are float32 (or bf16 in and out): compare them with each other.
  const double tolerance = c.dtype == at::kBFloat16 ? 2e-2 : 1e-4;
  compare(result, "module q'", outs[1][0], outs[0][0], tolerance);
  compare(result, "module k'", outs[1][1], outs[0][1], tolerance);
  for (size_t i = 0; i < grads[0].size(); ++i)
    compare(result, "module grad " + std::to_string(i), grads[1][i], grads[0][i], tolerance);
  return result;
}

}  // namespace cqk::fused_check
