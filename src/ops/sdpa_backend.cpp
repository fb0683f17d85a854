#include "cqk/sdpa_backend.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include "cqk/attention.h"
#include "cqk/config.h"

namespace cqk {
namespace {

// Torch's default order (ATen/Context.h).
const std::vector<at::SDPBackend> kTorchOrder{at::SDPBackend::flash_attention, at::SDPBackend::efficient_attention,
                                              at::SDPBackend::math, at::SDPBackend::cudnn_attention,
                                              at::SDPBackend::overrideable};

at::SDPBackend torch_backend(SdpaBackend backend) {
  switch (backend) {
    case SdpaBackend::CuDnn: return at::SDPBackend::cudnn_attention;
    case SdpaBackend::Flash: return at::SDPBackend::flash_attention;
    case SdpaBackend::Efficient: return at::SDPBackend::efficient_attention;
    case SdpaBackend::Math: return at::SDPBackend::math;
    case SdpaBackend::Auto: break;
  }
  return at::SDPBackend::error;
}

std::string torch_backend_name(int64_t choice) {
  switch (static_cast<at::SDPBackend>(choice)) {
    case at::SDPBackend::math: return "math";
    case at::SDPBackend::flash_attention: return "flash";
    case at::SDPBackend::efficient_attention: return "efficient";
    case at::SDPBackend::cudnn_attention: return "cudnn";
    case at::SDPBackend::overrideable: return "overrideable";
    default: return "none";
  }
}

}  // namespace

void use_sdpa_backend(SdpaBackend backend) {
  const auto first = torch_backend(backend);
  std::vector<int64_t> order;
  if (first != at::SDPBackend::error) order.push_back(static_cast<int64_t>(first));
  for (const auto b : kTorchOrder)
    if (b != first) order.push_back(static_cast<int64_t>(b));
  at::globalContext().setSDPPriorityOrder(order);
}

std::string sdpa_backend_for(int64_t batch, int64_t heads, int64_t time, int64_t head_dim, int64_t value_dim,
                             bool bf16, bool cuda) {
  const auto options =
      at::TensorOptions().dtype(bf16 ? at::kBFloat16 : at::kFloat).device(cuda ? at::kCUDA : at::kCPU);
  const auto q = at::empty({batch, heads, time, head_dim}, options).requires_grad_();
  const auto v = at::empty({batch, heads, time, value_dim}, options).requires_grad_();
  return torch_backend_name(at::_fused_sdp_choice(q, q, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true));
}

std::string use_sdpa_backend(const Config& config, int64_t batch, bool bf16, bool cuda) {
  use_sdpa_backend(config.train.sdpa_backend);
  const auto& m = config.model;
  const int64_t head_dim = m.width / m.heads;
  const int64_t t = config.data.seq_len;
  switch (m.attention.kind()) {
    case AttentionKind::Differential: return sdpa_backend_for(batch, m.heads / 2, t, head_dim, 2 * head_dim, bf16, cuda);
    case AttentionKind::MultiToken:
      if (m.attention.mta().every() == 1) return "none";
      break;
    default: break;
  }
  return sdpa_backend_for(batch, m.heads, t, head_dim, head_dim, bf16, cuda);
}

}  // namespace cqk
