#include "cqk/coupling_diagnostics.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

namespace cqk {

namespace {

double relative_change(const at::Tensor& after, const at::Tensor& before) {
  const double norm = before.norm().item<double>();
  return norm > 0.0 ? (after - before).norm().item<double>() / norm : 0.0;
}

}  // namespace

CouplingDiagnostics coupling_diagnostics(const QKCouplingImpl& coupling, const at::Tensor& q, const at::Tensor& k) {
  at::NoGradGuard no_grad;
  const auto qf = q.to(at::kFloat), kf = k.to(at::kFloat);
  std::vector<at::Tensor> log_scales;
  const auto [q_out, k_out] = coupling.transform(qf, kf, &log_scales);
  CouplingDiagnostics result;
  result.q_change = relative_change(q_out, qf);
  result.k_change = relative_change(k_out, kf);
  const auto& options = coupling.options();
  if (options.kind() == CouplingKind::Affine) {
    // Each step scales half of (q, k) by exp(s) given the other half: a
    // triangular Jacobian whose log-determinant is the sum of s.
    auto abs_sum = at::zeros({}, qf.options()), log_det = at::zeros(qf.sizes().slice(0, 3), qf.options());
    for (const auto& s : log_scales) {
      abs_sum += s.abs().mean();
      log_det += s.sum(-1);
    }
    result.mean_abs_log_scale = abs_sum.item<double>() / static_cast<double>(log_scales.size());
    result.mean_log_det = log_det.mean().item<double>();
  } else if (options.kind() == CouplingKind::Dynamics && options.integrator() == Integrator::Symplectic) {
    result.mean_log_det = 0.0;  // each step is a shear in q, then in k
  }
  return result;
}

CouplingDiagnostics mean_over_layers(const std::vector<CouplingDiagnostics>& layers) {
  CouplingDiagnostics mean;
  const double n = static_cast<double>(layers.size());
  for (const auto& l : layers) {
    mean.q_change += l.q_change / n;
    mean.k_change += l.k_change / n;
    if (l.mean_abs_log_scale) mean.mean_abs_log_scale = mean.mean_abs_log_scale.value_or(0.0) + *l.mean_abs_log_scale / n;
    if (l.mean_log_det) mean.mean_log_det = mean.mean_log_det.value_or(0.0) + *l.mean_log_det / n;
  }
  return mean;
}

std::vector<CouplingDiagnostics> coupling_diagnostics(TransformerLM& model, const at::Tensor& tokens) {
  std::vector<CouplingDiagnostics> layers;
  if (model->config().attention.coupling().kind() == CouplingKind::None) return layers;
  at::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  // The residual stream as the model computes it, layer by layer.
  auto h = model->embedding(tokens);
  for (const auto& item : *model->blocks) {
    auto& block = *item->as<Block>();
    const auto [q, k] = block.attention->coupling_inputs(block.attention_norm(h));
    auto layer = coupling_diagnostics(*block.attention->coupling_, q, k);
    layer.layer = static_cast<int64_t>(layers.size());
    layers.push_back(layer);
    h = block.forward(h);
  }
  return layers;
}

}  // namespace cqk
