#include "ops/qk_path.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>

#include "ops/cpu_coupling.h"
#include "cqk/coupling.h"
#include "ops/cuda_coupling.h"
#include "cqk/rms_norm.h"
#include "cqk/rope.h"
#include "ops/recompute_from_inverse.h"

namespace cqk::ops {

namespace {

bool is_reduced_precision(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
}

// What `before` asks for that the coupling's path did not already apply.
std::pair<at::Tensor, at::Tensor> finish(at::Tensor q, at::Tensor k, const BeforeScoring& before, bool rope_applied) {
  if (before.q_norm) {
    q = before.q_norm->forward(q);
    k = before.k_norm->forward(k);
  }
  if (before.rope_base && !rope_applied) {
    q = apply_rope(q, *before.rope_base);
    k = apply_rope(k, *before.rope_base);
  }
  return {q, k};
}

}  // namespace

std::pair<at::Tensor, at::Tensor> couple(QKCouplingImpl& coupling, const at::Tensor& q, const at::Tensor& k,
                                         const BeforeScoring& before) {
  const auto& options = coupling.options();
  if (options.kind() == CouplingKind::None) return finish(q, k, before, /*rope_applied=*/false);
  RECORD_USER_SCOPE("cqk::coupling");  // with the QK-norm and RoPE that follow it; a profiler range
  if (cuda_affine_coupling_applies(coupling, q, k)) {
    if (!before.q_norm || cuda_qk_norm_applies(before.q_norm->weight, before.k_norm->weight, q)) {
      std::optional<CudaQKNorm> norm;
      if (before.q_norm) norm = CudaQKNorm{before.q_norm->weight, before.k_norm->weight, before.q_norm->eps()};
      return cuda_affine_coupling(coupling, q, k, before.rope_base, norm);
    }
    const auto [q_out, k_out] = cuda_affine_coupling(coupling, q, k);
    return finish(q_out, k_out, before, /*rope_applied=*/false);
  }

  std::pair<at::Tensor, at::Tensor> out;
  bool rope_applied = false;
  {
    // The map runs in float32 even under bf16 autocast: exp(s) and the inverse
    // need the precision, and the work is tiny next to the scoring.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const bool upcast = is_reduced_precision(q);
    const auto qf = upcast ? q.to(at::kFloat) : q;
    const auto kf = upcast ? k.to(at::kFloat) : k;
    const bool backward_to_come =
        at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || coupling.is_training());
    if (cpu_affine_coupling_applies(coupling, qf, kf)) {
      // RoPE in the kernel's pass, unless QK-norm comes between.
      rope_applied = before.rope_base.has_value() && !before.q_norm;
      out = cpu_affine_coupling(coupling, qf, kf, rope_applied ? before.rope_base : std::nullopt);
    } else if (options.recompute_from_inverse() && is_invertible(options) && backward_to_come) {
      out = recompute_from_inverse(coupling, qf, kf);
    } else {
      out = coupling.transform(qf, kf);
    }
    if (upcast) out = {out.first.to(q.scalar_type()), out.second.to(q.scalar_type())};
  }
  return finish(out.first, out.second, before, rope_applied);
}

at::Tensor coupled_attention(QKCouplingImpl& coupling, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const BeforeScoring& before, const Scoring& scoring) {
  const auto [q_ready, k_ready] = couple(coupling, q, k, before);
  return scoring.score(q_ready, k_ready, v);
}

std::pair<at::Tensor, at::Tensor> paired_coupled_attention(QKCouplingImpl& coupling, const at::Tensor& q,
                                                           const at::Tensor& k, const at::Tensor& v,
                                                           const BeforeScoring& before,
                                                           const std::vector<int64_t>& coupling_shape,
                                                           const Scoring& scoring) {
  auto [q_ready, k_ready] = couple(coupling, q.reshape(coupling_shape), k.reshape(coupling_shape), before);
  q_ready = q_ready.reshape(q.sizes());
  k_ready = k_ready.reshape(k.sizes());
  return {scoring.score(q_ready.select(1, 0), k_ready.select(1, 0), v),
          scoring.score(q_ready.select(1, 1), k_ready.select(1, 1), v)};
}

}  // namespace cqk::ops
