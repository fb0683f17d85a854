#include "cqk/rms_norm.h"

#include <ATen/ATen.h>

#include "model/option_checks.h"
#include "ops/rms_norm_kernel.h"

namespace cqk {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  check_positive_sizes("rms_norm", {{"dim", dim}});
  check_positive_finite("rms_norm", "eps", eps);
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) const {
  if (ops::rms_norm_kernel_applies(x, weight)) return ops::rms_norm_kernel(x, weight, eps_);
  // Statistics in float32 at least, so bf16 activations normalise accurately.
  const auto compute_type = at::promote_types(x.scalar_type(), at::kFloat);
  const auto xf = x.to(compute_type);
  const auto normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return (normed * weight).to(x.scalar_type());
}

}  // namespace cqk
