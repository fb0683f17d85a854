#include "ops/kernel_arguments.h"

#include <ATen/ATen.h>
#ifdef CQK_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <stdexcept>

namespace cqk::kernel_arguments {

namespace kn = cqk::kernels;

namespace {
[[noreturn]] void fail(const std::string& who, const std::string& what) {
  throw std::invalid_argument(who + ": " + what);
}
}  // namespace

kn::ElementType element_type(const at::Tensor& t, const std::string& who) {
  if (t.scalar_type() == at::kFloat) return kn::ElementType::Float32;
  if (t.scalar_type() == at::kBFloat16) return kn::ElementType::BFloat16;
  fail(who, std::string("dtype ") + c10::toString(t.scalar_type()) + " is not supported (float32, bfloat16)");
}

kn::RowStrides row_strides(const at::Tensor& t) {
  return {t.size(0) == 1 ? 0 : t.stride(0), t.size(1) == 1 ? 0 : t.stride(1), t.size(2) == 1 ? 0 : t.stride(2)};
}

#ifdef CQK_WITH_CUDA
at::Tensor kernel_readable(const at::Tensor& t, const std::string& who) {
  const kn::ElementType type = element_type(t, who);
  bool readable = t.size(-1) == 1 || t.stride(-1) == 1;
  // Every row on a 16-byte boundary: the data pointer and the stride of every
  // leading dimension (0 for those of size 1), whatever the rank.
  for (int64_t d = 0; readable && d + 1 < t.dim(); ++d)
    readable = kn::fused_coupling_rows_aligned(t.data_ptr(), {t.size(d) == 1 ? 0 : t.stride(d), 0, 0}, type);
  return readable ? t : t.clone(at::MemoryFormat::Contiguous);
}
#endif

kn::CouplingShape shape_of(const CouplingOptions& o, const at::Tensor& q) {
  return {q.size(0), q.size(1), q.size(2), q.size(3), o.hidden()};
}

kn::AffineCouplingParams coupling_params(const CouplingOptions& o, const std::vector<at::Tensor>& weights,
                                         const at::Device& device, const std::string& who) {
  const int64_t steps = o.steps(), g = o.shared_across_heads() ? 1 : o.num_heads(), d = o.head_dim(), r = o.hidden();
  if (steps < 1 || steps > kn::AffineCouplingParams::kMaxSteps)
    fail(who, "steps must be 1.." + std::to_string(kn::AffineCouplingParams::kMaxSteps));
  if (static_cast<int64_t>(weights.size()) != 4 * steps)
    fail(who, "expected " + std::to_string(4 * steps) + " weight tensors, got " + std::to_string(weights.size()));
  const std::vector<int64_t> shapes[4] = {{g, r, d}, {g, r}, {g, 2 * d, r}, {g, 2 * d}};
  kn::AffineCouplingParams p;
  for (int64_t i = 0; i < steps; ++i) {
    for (int j = 0; j < 4; ++j) {
      const at::Tensor& w = weights[4 * i + j];
      if (!w.defined() || w.scalar_type() != at::kFloat || !w.is_contiguous() || w.device() != device ||
          w.sizes() != at::IntArrayRef(shapes[j]))
        fail(who, "weight " + std::to_string(j) + " of step " + std::to_string(i) + " must be contiguous float32 " +
                      c10::str(at::IntArrayRef(shapes[j])) + " on " + device.str());
    }
    p.w1[i] = weights[4 * i].data_ptr<float>();
    p.b1[i] = weights[4 * i + 1].data_ptr<float>();
    p.w2[i] = weights[4 * i + 2].data_ptr<float>();
    p.b2[i] = weights[4 * i + 3].data_ptr<float>();
  }
  p.num_steps = static_cast<int>(steps);
  p.shared_across_heads = o.shared_across_heads();
  p.clamp = static_cast<float>(o.clamp());
  return p;
}

kn::AffineCouplingGrads coupling_grads(const std::vector<at::Tensor>& weights,
                                       const std::vector<at::Tensor>& weight_grads, const at::Device& device,
                                       const std::string& who) {
  if (weight_grads.size() != weights.size()) fail(who, "one weight gradient per weight expected");
  for (size_t i = 0; i < weights.size(); ++i) {
    const auto& wg = weight_grads[i];
    if (!wg.defined() || wg.scalar_type() != at::kFloat || !wg.is_contiguous() ||
        wg.sizes() != weights[i].sizes() || wg.device() != device)
      fail(who, "weight gradients must be contiguous float32 tensors shaped like the weights");
  }
  kn::AffineCouplingGrads g{};
  for (size_t i = 0; 4 * i + 3 < weight_grads.size(); ++i) {
    g.w1[i] = weight_grads[4 * i].data_ptr<float>();
    g.b1[i] = weight_grads[4 * i + 1].data_ptr<float>();
    g.w2[i] = weight_grads[4 * i + 2].data_ptr<float>();
    g.b2[i] = weight_grads[4 * i + 3].data_ptr<float>();
  }
  return g;
}

kn::RopeTables rope_tables(const at::Tensor& cos, const at::Tensor& sin, int64_t time, int64_t head_dim,
                           const at::Device& device, const std::string& who) {
  if (!cos.defined() && !sin.defined()) return {};
  for (const auto* table : {&cos, &sin})
    if (!table->defined() || table->scalar_type() != at::kFloat || !table->is_contiguous() ||
        table->device() != device || table->sizes() != at::IntArrayRef{time, head_dim / 2})
      fail(who, "RoPE tables must be contiguous float32 [" + std::to_string(time) + ", " +
                    std::to_string(head_dim / 2) + "] tensors on the inputs' device");
  return {cos.data_ptr<float>(), sin.data_ptr<float>()};
}

bool is_channel_vector(const at::Tensor& t, int64_t dim, const at::Device& device) {
  return t.defined() && t.scalar_type() == at::kFloat && t.is_contiguous() && t.dim() == 1 && t.size(0) == dim &&
         t.device() == device;
}

#ifdef CQK_WITH_CUDA
void* current_stream(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.get_device()).stream(); }
#endif

}  // namespace cqk::kernel_arguments
