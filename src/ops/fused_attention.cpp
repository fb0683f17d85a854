// Torch side of the flash coupled attention: the switch, the dispatch checks,
// the RoPE tables and the autograd function. The kernels themselves
// (kernels/attention_kernels.cu) see raw pointers only. Without CUDA
// (CQK_WITH_CUDA undefined) only the switch and stubs are compiled.
#include "cqk/fused_attention.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "cqk/coupling.h"
#include "cqk/fused_coupling.h"
#include "cqk/rope.h"
#include "cqk/runtime.h"

#ifdef CQK_WITH_CUDA
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/autograd.h>

#include "ops/coupling_autograd.h"
#include "attention_kernels.h"  // kernels/: the launchers
#include "ops/kernel_arguments.h"
#endif

namespace cqk {

namespace {

ProcessSwitch& enabled_switch() {
  static ProcessSwitch on("CQK_FUSED_ATTENTION", /*default_on=*/false);
  return on;
}

}  // namespace

bool fused_attention_enabled() { return enabled_switch().on(); }
void set_fused_attention_enabled(bool enabled) { enabled_switch().set(enabled); }

#ifdef CQK_WITH_CUDA

namespace {

namespace kn = cqk::kernels;
namespace args = cqk::kernel_arguments;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr const char* kWho = "fused attention";

// Strides of the batch, pair, head and time dimensions of a [batch, pairs,
// heads, time, dim] tensor; dimensions of size 1 get 0, as in args::row_strides.
kn::PairedRowStrides paired_row_strides(const at::Tensor& t) {
  const auto stride = [&](int64_t dim) { return t.size(dim) == 1 ? 0 : t.stride(dim); };
  return {stride(0), stride(1), stride(2), stride(3)};
}

// Whether the coupling has one head per (pair, head) of q = [batch, pairs, heads, time, d]
// rather than one per head shared by the pairs.
bool separate_pair_couplings(const CouplingOptions& options, const at::Tensor& q) {
  return q.size(1) > 1 && options.num_heads() == q.size(1) * q.size(2);
}

// [batch, pairs, heads, time, d] as the coupling takes it: the pairs folded
// into the heads (separate couplings, pair-major) or into the batch (shared).
at::Tensor coupling_layout(const at::Tensor& t, bool separate_pairs) {
  return separate_pairs ? t.reshape({t.size(0), t.size(1) * t.size(2), t.size(3), t.size(4)})
                        : t.reshape({t.size(0) * t.size(1), t.size(2), t.size(3), t.size(4)});
}

kn::CoupledAttentionInputs kernel_inputs(const CouplingOptions& options, const std::vector<at::Tensor>& weights,
                                         const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const at::Tensor& cos, const at::Tensor& sin) {
  kn::CoupledAttentionInputs in;
  in.q = q.data_ptr();
  in.q_strides = paired_row_strides(q);
  in.k = k.data_ptr();
  in.k_strides = paired_row_strides(k);
  in.v = v.data_ptr();
  in.v_strides = args::row_strides(v);
  in.shape = {q.size(0), q.size(1), q.size(2), q.size(3), q.size(4), v.size(3), options.hidden()};
  in.coupling = args::coupling_params(options, weights, q.device(), kWho);
  in.separate_pair_couplings = separate_pair_couplings(options, q);
  in.rope = args::rope_tables(cos, sin, q.size(3), q.size(4), q.device(), kWho);
  in.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(q.size(4))));
  return in;
}

// Over q, k [batch, pairs, heads, time, d] and v [batch, heads, time, dv].
// Saves the inputs (read in place where the kernels can), the output, the
// row statistics lse2, the RoPE tables and the weights: no coupled q or k.
struct FusedCoupledAttention : public torch::autograd::Function<FusedCoupledAttention> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               at::TensorList weights, CouplingOptions options, std::optional<double> rope_base) {
    const c10::cuda::CUDAGuard guard(q.device());
    const std::vector<at::Tensor> w(weights.begin(), weights.end());
    const auto qr = args::kernel_readable(q, kWho), kr = args::kernel_readable(k, kWho),
               vr = args::kernel_readable(v, kWho);
    at::Tensor cos, sin;
    if (rope_base) std::tie(cos, sin) = rope_tables(q.size(3), q.size(4), *rope_base, q.device());
    auto o = at::empty({q.size(0), q.size(1), q.size(2), q.size(3), v.size(3)},
                       q.options().memory_format(at::MemoryFormat::Contiguous));
    auto lse2 = at::empty({q.size(0), q.size(1), q.size(2), q.size(3)}, q.options().dtype(at::kFloat));
    kn::coupled_attention_forward_cuda(args::element_type(q, kWho), kernel_inputs(options, w, qr, kr, vr, cos, sin),
                                       o.data_ptr(), lse2.data_ptr<float>(), args::current_stream(q));
    std::vector<at::Tensor> saved{qr, kr, vr, o, lse2};
    saved.insert(saved.end(), w.begin(), w.end());
    ctx->save_for_backward(saved);
    save_rope_tables(ctx, cos, sin);
    save_coupling_options(ctx, options);
    return {o};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &o = saved[3], &lse2 = saved[4];
    const std::vector<at::Tensor> weights(saved.begin() + 5, saved.end());
    const auto options = saved_coupling_options(ctx);
    const auto [cos, sin] = saved_rope_tables(ctx);
    const c10::cuda::CUDAGuard guard(q.device());
    const auto grad_o = args::kernel_readable(grads[0].defined() ? grads[0] : at::zeros_like(o), kWho);

    // The attention's backward: gradients with respect to the coupled q', k' (float32) and v.
    const auto f32 = q.options().dtype(at::kFloat).memory_format(at::MemoryFormat::Contiguous);
    auto delta = at::empty(lse2.sizes(), f32);
    auto dq_coupled = at::zeros(q.sizes(), f32), dk_coupled = at::empty(q.sizes(), f32);
    auto dv = at::empty(v.sizes(), v.options().memory_format(at::MemoryFormat::Contiguous));
    const auto stream = args::current_stream(q);
    kn::coupled_attention_backward_cuda(args::element_type(q, kWho), kernel_inputs(options, weights, q, k, v, cos, sin),
                                        o.data_ptr(), grad_o.data_ptr(), paired_row_strides(grad_o),
                                        lse2.data_ptr<float>(), delta.data_ptr<float>(), dq_coupled.data_ptr<float>(),
                                        dk_coupled.data_ptr<float>(), dv.data_ptr(), stream);

    // The coupling's backward from its outputs, recomputed here (the forward kept
    // none) in float32 whatever q's dtype: the attention's kernels coupled q and
    // k in float32 registers, and the gradients above are float32 too, so bf16
    // inputs lose nothing more than their own rounding. Every buffer is in the
    // coupling's layout (contiguous [batch, pairs, heads, time, d] seen through
    // coupling_layout).
    const bool separate = separate_pair_couplings(options, q);
    const auto in_layout = [&](const at::Tensor& t) { return coupling_layout(t, separate); };
    const auto q32 = in_layout(q.to(at::kFloat).contiguous()), k32 = in_layout(k.to(at::kFloat).contiguous());
    auto q_coupled = at::empty(q32.sizes(), f32), k_coupled = at::empty(k32.sizes(), f32);
    fused::affine_forward_out(options, weights, q32, k32, q_coupled, k_coupled);
    auto dq = at::empty(q32.sizes(), f32), dk = at::empty(k32.sizes(), f32);
    std::vector<at::Tensor> weight_grads;
    for (const auto& w : weights) weight_grads.push_back(at::zeros_like(w, at::MemoryFormat::Contiguous));
    fused::affine_backward_out(options, weights, q_coupled, k_coupled, in_layout(dq_coupled), in_layout(dk_coupled),
                               dq, dk, weight_grads);
    variable_list result{dq.view(q.sizes()).to(q.scalar_type()), dk.view(k.sizes()).to(k.scalar_type()), dv};
    result.insert(result.end(), weight_grads.begin(), weight_grads.end());
    result.emplace_back();  // options
    result.emplace_back();  // rope_base
    return result;
  }
};

// Why the kernels cannot take these inputs (q, k [batch, pairs, heads, time,
// d], v [batch, heads, time, dv]), or "" when they can (the switch, the
// compiled dims and the device's shared memory aside): what applies() asks and
// what the attention functions refuse, since the kernels trust the shapes.
std::string unsupported_paired_inputs(const CouplingOptions& o, const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v) {
  for (const at::Tensor* t : {&q, &k, &v})
    if (!t->defined() || !t->is_cuda() || t->device() != q.device() || t->scalar_type() != q.scalar_type())
      return "q, k and v must be CUDA tensors of one dtype and device";
  if (q.dim() != 5 || k.sizes() != q.sizes() || v.dim() != 4 || v.size(0) != q.size(0) || v.size(1) != q.size(2) ||
      v.size(2) != q.size(3))
    return "q and k must be [batch, pairs, heads, time, d] and v [batch, heads, time, dv], got " + c10::str(q.sizes()) +
           ", " + c10::str(k.sizes()) + ", " + c10::str(v.sizes());
  const int64_t pairs = q.size(1), heads = q.size(2);
  if ((o.num_heads() != heads && o.num_heads() != pairs * heads) || q.size(4) != o.head_dim())
    return "a coupling of " + std::to_string(o.num_heads()) + " heads of dim " + std::to_string(o.head_dim()) +
           " does not fit q " + c10::str(q.sizes()) + " (heads, or pairs * heads)";
  if (q.scalar_type() != at::kFloat && q.scalar_type() != at::kBFloat16)
    return std::string("dtype ") + c10::toString(q.scalar_type()) + " is not supported (float32, bfloat16)";
  if (o.kind() != CouplingKind::Affine) return "the coupling must be affine";
  if (q.size(0) * pairs * heads > 65535)
    return "batch * pairs * heads above 65535 (one grid row per (batch, pair, head))";
  return "";
}

// The vanilla entry points' extra condition: q, k and v of one 4-D shape.
std::string unsupported_inputs(const CouplingOptions& o, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v) {
  for (const at::Tensor* t : {&q, &k, &v})
    if (!t->defined() || t->dim() != 4 || t->sizes() != q.sizes())
      return "q, k and v must be 4-D tensors of one shape";
  return unsupported_paired_inputs(o, q.unsqueeze(1), k.unsqueeze(1), v);
}

}  // namespace

bool fused_attention_built() { return true; }

bool fused_paired_coupled_attention_applies(const QKCouplingImpl& coupling, const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v) {
  const auto& o = coupling.options();
  if (!fused_attention_enabled() || !unsupported_paired_inputs(o, q, k, v).empty()) return false;
  {
    const c10::cuda::CUDAGuard guard(q.device());
    // The backward runs the attention's kernels and then the coupling's one-pass backward.
    if (!kn::coupled_attention_supported(o.head_dim(), v.size(3), o.hidden(), o.steps()) ||
        !kn::fused_coupling_supported(o.head_dim(), o.hidden(), o.steps()))
      return false;
  }
  for (const auto& p : coupling.parameters())
    if (p.scalar_type() != at::kFloat || p.device() != q.device()) return false;
  return true;
}

bool fused_coupled_attention_applies(const QKCouplingImpl& coupling, const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& v) {
  return unsupported_inputs(coupling.options(), q, k, v).empty() &&
         fused_paired_coupled_attention_applies(coupling, q.unsqueeze(1), k.unsqueeze(1), v);
}

at::Tensor fused_paired_coupled_attention(const QKCouplingImpl& coupling, const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, std::optional<double> rope_base) {
  if (const auto problem = unsupported_paired_inputs(coupling.options(), q, k, v); !problem.empty())
    throw std::invalid_argument(std::string(kWho) + ": " + problem);
  const auto weights = fused::affine_weights(coupling);
  return FusedCoupledAttention::apply(q, k, v, at::TensorList(weights), coupling.options(), rope_base)[0];
}

at::Tensor fused_coupled_attention(const QKCouplingImpl& coupling, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, std::optional<double> rope_base) {
  if (const auto problem = unsupported_inputs(coupling.options(), q, k, v); !problem.empty())
    throw std::invalid_argument(std::string(kWho) + ": " + problem);
  return fused_paired_coupled_attention(coupling, q.unsqueeze(1), k.unsqueeze(1), v, rope_base).squeeze(1);
}

#else  // !CQK_WITH_CUDA

bool fused_attention_built() { return false; }
bool fused_coupled_attention_applies(const QKCouplingImpl&, const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  return false;
}
bool fused_paired_coupled_attention_applies(const QKCouplingImpl&, const at::Tensor&, const at::Tensor&,
                                            const at::Tensor&) {
  return false;
}
at::Tensor fused_coupled_attention(const QKCouplingImpl&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   std::optional<double>) {
  throw std::logic_error("cqk was built without CUDA: the fused attention kernels are not available");
}
at::Tensor fused_paired_coupled_attention(const QKCouplingImpl&, const at::Tensor&, const at::Tensor&,
                                          const at::Tensor&, std::optional<double>) {
  throw std::logic_error("cqk was built without CUDA: the fused attention kernels are not available");
}

#endif  // CQK_WITH_CUDA

}  // namespace cqk
