// Torch side of the fused affine coupling: checks, the autograd function and
// the launches on the current CUDA stream. The kernels themselves
// (kernels/coupling_kernels.cu) see raw pointers only. Without CUDA
// (CQK_WITH_CUDA undefined) only the switch and stubs are compiled.
#include "ops/cuda_coupling.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "cqk/coupling.h"
#include "cqk/rope.h"
#include "cqk/runtime.h"

#ifdef CQK_WITH_CUDA
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/autograd.h>

#include "ops/coupling_autograd.h"
#include "coupling_kernels.h"  // kernels/: the launchers
#include "ops/kernel_arguments.h"
#endif

namespace cqk {

namespace {

ProcessSwitch& enabled_switch() {
  static ProcessSwitch on("CQK_FUSED_COUPLING", /*default_on=*/true);
  return on;
}

}  // namespace

bool fused_coupling_enabled() { return enabled_switch().on(); }
void set_fused_coupling_enabled(bool enabled) { enabled_switch().set(enabled); }

namespace fused {

std::vector<at::Tensor> affine_weights(const QKCouplingImpl& coupling) {
  const auto named = coupling.named_parameters();
  std::vector<at::Tensor> weights;
  for (int64_t i = 0; i < coupling.options().steps(); ++i) {
    for (const char* name : {"w1", "b1", "w2", "b2"}) {
      const std::string key = "conditioner" + std::to_string(i) + "." + name;
      const at::Tensor* w = named.find(key);
      if (!w) throw std::logic_error("the coupling has no parameter " + key);
      weights.push_back(*w);
    }
  }
  return weights;
}

}  // namespace fused

#ifdef CQK_WITH_CUDA

namespace {

namespace kn = cqk::kernels;

constexpr const char* kWho = "fused coupling";

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument(std::string(kWho) + ": " + what); }

kn::ElementType element_type(const at::Tensor& t) { return kernel_arguments::element_type(t, kWho); }
at::Tensor kernel_readable(const at::Tensor& t) { return kernel_arguments::kernel_readable(t, kWho); }
using kernel_arguments::current_stream;
using kernel_arguments::row_strides;

// fused::AfterCoupling as the coupling kernels take it, checked against the
// coupling's [batch, heads, time, head_dim] input or output `like`: RoPE tables
// (kernel_arguments::rope_tables), QK-norm weights of both q and k or neither
// ([head_dim] contiguous float32 on like's device) and, for the forward, the
// coupled outputs if any (both, contiguous, like's shape and dtype).
kn::AfterCoupling after_coupling(const fused::AfterCoupling& after, const at::Tensor& like, bool forward) {
  const int64_t time = like.size(2), head_dim = like.size(3);
  kn::AfterCoupling out;
  out.rope = kernel_arguments::rope_tables(after.rope_cos, after.rope_sin, time, head_dim, like.device(), kWho);
  if (!after.q_norm_weight.defined() && !after.k_norm_weight.defined()) return out;
  if (!kernel_arguments::is_channel_vector(after.q_norm_weight, head_dim, like.device()) ||
      !kernel_arguments::is_channel_vector(after.k_norm_weight, head_dim, like.device()))
    fail("QK-norm weights must be contiguous float32 [" + std::to_string(head_dim) +
         "] tensors on the inputs' device, for both q and k");
  out.norm = {after.q_norm_weight.data_ptr<float>(), after.k_norm_weight.data_ptr<float>(),
              static_cast<float>(after.norm_eps)};
  if (forward && (after.q_coupled.defined() || after.k_coupled.defined())) {
    for (const auto* coupled : {&after.q_coupled, &after.k_coupled})
      if (!coupled->defined() || !coupled->is_contiguous() || coupled->sizes() != like.sizes() ||
          coupled->scalar_type() != like.scalar_type() || coupled->device() != like.device())
        fail("q_coupled and k_coupled must both be contiguous tensors of q's shape, dtype and device");
    out.q_coupled = after.q_coupled.data_ptr();
    out.k_coupled = after.k_coupled.data_ptr();
  }
  return out;
}

// The QK-norm weights' gradients of `after` (shaped like the weights), for the backward.
kn::QKNormGrads qk_norm_grads(const fused::AfterCoupling& after) {
  if (!after.q_norm_weight.defined()) return {};
  const int64_t dim = after.q_norm_weight.numel();
  const auto device = after.q_norm_weight.device();
  if (!kernel_arguments::is_channel_vector(after.q_norm_weight_grad, dim, device) ||
      !kernel_arguments::is_channel_vector(after.k_norm_weight_grad, dim, device))
    fail("QK-norm weight gradients must be contiguous float32 tensors shaped like the weights");
  return {after.q_norm_weight_grad.data_ptr<float>(), after.k_norm_weight_grad.data_ptr<float>()};
}
using kernel_arguments::shape_of;

void check_inputs(const CouplingOptions& o, const at::Tensor& q, const at::Tensor& k) {
  if (!q.is_cuda() || !k.is_cuda() || q.device() != k.device()) fail("q and k must be CUDA tensors on one device");
  if (q.dim() != 4 || q.sizes() != k.sizes() || q.size(1) != o.num_heads() || q.size(3) != o.head_dim())
    fail("q and k must both be [batch, " + std::to_string(o.num_heads()) + ", time, " +
         std::to_string(o.head_dim()) + "], got " + c10::str(q.sizes()) + " and " + c10::str(k.sizes()));
  if (q.scalar_type() != k.scalar_type()) fail("q and k must have one dtype");
  element_type(q);
}

void check_dense_like(const at::Tensor& t, const at::Tensor& like, const char* name) {
  if (!t.defined() || t.sizes() != like.sizes() || t.scalar_type() != like.scalar_type() ||
      t.device() != like.device() || !t.is_contiguous())
    fail(std::string(name) + " must be a contiguous tensor of q's shape, dtype and device");
}

kn::AffineCouplingParams make_params(const CouplingOptions& o, const std::vector<at::Tensor>& weights,
                                     const at::Device& device) {
  return kernel_arguments::coupling_params(o, weights, device, kWho);
}

// What the forward applies after the coupling, for q's shape: RoPE tables for
// rope_base, the QK-norm weights when qk_norm_eps is set (and then, with
// keep_coupled, buffers for the coupling's own outputs, which the backward needs).
fused::AfterCoupling after_coupling_for(const at::Tensor& q, std::optional<double> rope_base,
                                        std::optional<double> qk_norm_eps, const at::Tensor& q_norm_weight,
                                        const at::Tensor& k_norm_weight, bool keep_coupled) {
  fused::AfterCoupling after;
  if (rope_base) std::tie(after.rope_cos, after.rope_sin) = rope_tables(q.size(2), q.size(3), *rope_base, q.device());
  if (qk_norm_eps) {
    after.q_norm_weight = q_norm_weight;
    after.k_norm_weight = k_norm_weight;
    after.norm_eps = *qk_norm_eps;
    if (keep_coupled) {
      after.q_coupled = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
      after.k_coupled = at::empty_like(after.q_coupled);
    }
  }
  return after;
}

// Saves only the outputs (and the weights, which are parameters anyway, and
// the RoPE tables); the backward kernel rebuilds the inputs from the outputs.
// With QK-norm (qk_norm_eps set), the last two of `weights` are the norm's
// weights for q and k, and the coupling's own outputs are saved instead.
struct CudaAffineCoupling : public torch::autograd::Function<CudaAffineCoupling> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, at::TensorList weights, CouplingOptions options,
                                                std::optional<double> rope_base,
                                                std::optional<double> qk_norm_eps) {
    const std::vector<at::Tensor> all(weights.begin(), weights.end());
    const std::vector<at::Tensor> w(all.begin(), all.begin() + 4 * options.steps());
    auto q_out = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
    auto k_out = at::empty(k.sizes(), k.options().memory_format(at::MemoryFormat::Contiguous));
    const auto after = after_coupling_for(q, rope_base, qk_norm_eps, qk_norm_eps ? all[all.size() - 2] : at::Tensor(),
                                          qk_norm_eps ? all.back() : at::Tensor(), /*keep_coupled=*/true);
    fused::affine_forward_out(options, w, q, k, q_out, k_out, /*inverse=*/false, after);
    std::vector<at::Tensor> saved = qk_norm_eps ? std::vector<at::Tensor>{after.q_coupled, after.k_coupled}
                                                : std::vector<at::Tensor>{q_out, k_out};
    saved.insert(saved.end(), all.begin(), all.end());
    ctx->save_for_backward(saved);
    save_rope_tables(ctx, after.rope_cos, after.rope_sin);
    ctx->saved_data["qk_norm"] = qk_norm_eps.has_value();
    if (qk_norm_eps) ctx->saved_data["qk_norm_eps"] = *qk_norm_eps;
    save_coupling_options(ctx, options);
    return {q_out, k_out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto options = saved_coupling_options(ctx);
    const at::Tensor& q_saved = saved[0];
    const at::Tensor& k_saved = saved[1];
    const std::vector<at::Tensor> weights(saved.begin() + 2, saved.begin() + 2 + 4 * options.steps());
    const auto grad_q = grads[0].defined() ? grads[0] : at::zeros_like(q_saved);
    const auto grad_k = grads[1].defined() ? grads[1] : at::zeros_like(k_saved);
    auto dq = at::empty_like(q_saved, at::MemoryFormat::Contiguous);
    auto dk = at::empty_like(k_saved, at::MemoryFormat::Contiguous);
    std::vector<at::Tensor> weight_grads;
    for (const auto& w : weights) weight_grads.push_back(at::zeros_like(w, at::MemoryFormat::Contiguous));
    fused::AfterCoupling after;
    std::tie(after.rope_cos, after.rope_sin) = saved_rope_tables(ctx);
    const bool qk_norm = ctx->saved_data["qk_norm"].toBool();
    if (qk_norm) {
      after.q_norm_weight = saved[saved.size() - 2];
      after.k_norm_weight = saved.back();
      after.norm_eps = ctx->saved_data["qk_norm_eps"].toDouble();
      after.q_norm_weight_grad = at::zeros_like(after.q_norm_weight);
      after.k_norm_weight_grad = at::zeros_like(after.k_norm_weight);
    }
    fused::affine_backward_out(options, weights, q_saved, k_saved, grad_q, grad_k, dq, dk, weight_grads, after);
    torch::autograd::variable_list result{dq, dk};
    result.insert(result.end(), weight_grads.begin(), weight_grads.end());
    if (qk_norm) result.insert(result.end(), {after.q_norm_weight_grad, after.k_norm_weight_grad});
    result.emplace_back();  // options
    result.emplace_back();  // rope_base
    result.emplace_back();  // qk_norm_eps
    return result;
  }
};

}  // namespace

bool cuda_coupling_built() { return true; }

namespace fused {


void affine_forward_out(const CouplingOptions& options, const std::vector<at::Tensor>& weights, const at::Tensor& q,
                        const at::Tensor& k, const at::Tensor& q_out, const at::Tensor& k_out, bool inverse,
                        const AfterCoupling& after) {
  check_inputs(options, q, k);
  check_dense_like(q_out, q, "q_out");
  check_dense_like(k_out, q, "k_out");
  if (inverse && (after.rope_cos.defined() || after.q_norm_weight.defined() || after.q_coupled.defined()))
    fail("the inverse takes no RoPE or QK-norm");
  const c10::cuda::CUDAGuard guard(q.device());
  const auto params = make_params(options, weights, q.device());
  const auto applied = after_coupling(after, q, /*forward=*/true);
  const auto qr = kernel_readable(q), kr = kernel_readable(k);
  if (inverse) {
    kn::affine_coupling_inverse_cuda(element_type(q), qr.data_ptr(), row_strides(qr), kr.data_ptr(), row_strides(kr),
                                     q_out.data_ptr(), k_out.data_ptr(), shape_of(options, q), params,
                                     current_stream(q));
  } else {
    kn::affine_coupling_forward_cuda(element_type(q), qr.data_ptr(), row_strides(qr), kr.data_ptr(), row_strides(kr),
                                     q_out.data_ptr(), k_out.data_ptr(), shape_of(options, q), params, applied,
                                     current_stream(q));
  }
}

void affine_backward_out(const CouplingOptions& options, const std::vector<at::Tensor>& weights,
                         const at::Tensor& q_out, const at::Tensor& k_out, const at::Tensor& grad_q,
                         const at::Tensor& grad_k, const at::Tensor& dq, const at::Tensor& dk,
                         const std::vector<at::Tensor>& weight_grads, const AfterCoupling& after) {
  check_inputs(options, q_out, k_out);
  check_dense_like(k_out, q_out, "k_out");
  check_dense_like(q_out, q_out, "q_out");
  check_inputs(options, grad_q, grad_k);
  if (grad_q.scalar_type() != q_out.scalar_type() || grad_q.device() != q_out.device())
    fail("the gradients must have the outputs' dtype and device");
  check_dense_like(dq, q_out, "dq");
  check_dense_like(dk, q_out, "dk");
  const c10::cuda::CUDAGuard guard(q_out.device());
  const auto params = make_params(options, weights, q_out.device());
  const auto g = kernel_arguments::coupling_grads(weights, weight_grads, q_out.device(), kWho);
  const auto applied = after_coupling(after, q_out, /*forward=*/false);
  const auto norm_grads = qk_norm_grads(after);
  const auto gq = kernel_readable(grad_q), gk = kernel_readable(grad_k);
  kn::affine_coupling_backward_cuda(element_type(q_out), q_out.data_ptr(), k_out.data_ptr(), gq.data_ptr(),
                                    row_strides(gq), gk.data_ptr(), row_strides(gk), dq.data_ptr(), dk.data_ptr(),
                                    shape_of(options, q_out), params, g, applied, norm_grads, current_stream(q_out));
}

}  // namespace fused

bool cuda_affine_coupling_applies(const QKCouplingImpl& coupling, const at::Tensor& q, const at::Tensor& k) {
  const auto& o = coupling.options();
  if (!fused_coupling_enabled() || o.kind() != CouplingKind::Affine) return false;
  if (!q.defined() || !k.defined() || !q.is_cuda() || !k.is_cuda() || q.device() != k.device()) return false;
  if (q.scalar_type() != k.scalar_type() || (q.scalar_type() != at::kFloat && q.scalar_type() != at::kBFloat16))
    return false;
  if (q.dim() != 4 || q.sizes() != k.sizes()) return false;
  {
    const c10::cuda::CUDAGuard guard(q.device());
    if (!kn::fused_coupling_supported(o.head_dim(), o.hidden(), o.steps())) return false;
  }
  for (const auto& p : coupling.parameters())
    if (p.scalar_type() != at::kFloat || p.device() != q.device()) return false;
  return true;
}

bool cuda_qk_norm_applies(const at::Tensor& q_weight, const at::Tensor& k_weight, const at::Tensor& q) {
  return kernel_arguments::is_channel_vector(q_weight, q.size(-1), q.device()) &&
         kernel_arguments::is_channel_vector(k_weight, q.size(-1), q.device());
}

std::pair<at::Tensor, at::Tensor> cuda_affine_coupling(const QKCouplingImpl& coupling, const at::Tensor& q,
                                                        const at::Tensor& k, std::optional<double> rope_base,
                                                        const std::optional<CudaQKNorm>& qk_norm) {
  const auto weights = fused::affine_weights(coupling);
  // What autograd differentiates with respect to: the coupling's weights, then the norm's.
  std::vector<at::Tensor> parameters = weights;
  std::optional<double> qk_norm_eps;
  if (qk_norm) {
    parameters.insert(parameters.end(), {qk_norm->q_weight, qk_norm->k_weight});
    qk_norm_eps = qk_norm->eps;
  }
  const bool backward_to_come =
      at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() ||
                                     std::any_of(parameters.begin(), parameters.end(),
                                                 [](const at::Tensor& w) { return w.requires_grad(); }));
  if (qk_norm && !backward_to_come) {
    // Inference: the kernel need not keep the coupling's own outputs for a backward.
    auto q_out = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
    auto k_out = at::empty_like(q_out);
    const auto after =
        after_coupling_for(q, rope_base, qk_norm_eps, qk_norm->q_weight, qk_norm->k_weight, /*keep_coupled=*/false);
    fused::affine_forward_out(coupling.options(), weights, q, k, q_out, k_out, /*inverse=*/false, after);
    return {q_out, k_out};
  }
  auto out =
      CudaAffineCoupling::apply(q, k, at::TensorList(parameters), coupling.options(), rope_base, qk_norm_eps);
  return {out[0], out[1]};
}

#else  // !CQK_WITH_CUDA

namespace {
[[noreturn]] void not_built() {
  throw std::logic_error("cqk was built without CUDA: the fused coupling kernels are not available");
}
}  // namespace

bool cuda_coupling_built() { return false; }
bool cuda_affine_coupling_applies(const QKCouplingImpl&, const at::Tensor&, const at::Tensor&) { return false; }
std::pair<at::Tensor, at::Tensor> cuda_affine_coupling(const QKCouplingImpl&, const at::Tensor&, const at::Tensor&,
                                                        std::optional<double>, const std::optional<CudaQKNorm>&) {
  not_built();
}
bool cuda_qk_norm_applies(const at::Tensor&, const at::Tensor&, const at::Tensor&) { return false; }

namespace fused {
void affine_forward_out(const CouplingOptions&, const std::vector<at::Tensor>&, const at::Tensor&, const at::Tensor&,
                        const at::Tensor&, const at::Tensor&, bool, const AfterCoupling&) {
  not_built();
}
void affine_backward_out(const CouplingOptions&, const std::vector<at::Tensor>&, const at::Tensor&, const at::Tensor&,
                         const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                         const std::vector<at::Tensor>&, const AfterCoupling&) {
  not_built();
}
}  // namespace fused

#endif  // CQK_WITH_CUDA

}  // namespace cqk
