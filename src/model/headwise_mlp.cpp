#include "cqk/headwise_mlp.h"

#include <cmath>

#include "model/option_checks.h"

namespace cqk {

HeadwiseMLPImpl::HeadwiseMLPImpl(int64_t groups, int64_t in, int64_t hidden, int64_t out, bool zero_output) {
  check_positive_sizes("headwise_mlp", {{"groups", groups}, {"in", in}, {"hidden", hidden}, {"out", out}});
  const double bound1 = default_init_bound(in);
  w1 = register_parameter("w1", at::empty({groups, hidden, in}).uniform_(-bound1, bound1));
  b1 = register_parameter("b1", at::zeros({groups, hidden}));
  if (zero_output) {
    w2 = register_parameter("w2", at::zeros({groups, out, hidden}));
  } else {
    const double bound2 = default_init_bound(hidden);
    w2 = register_parameter("w2", at::empty({groups, out, hidden}).uniform_(-bound2, bound2));
  }
  b2 = register_parameter("b2", at::zeros({groups, out}));
}

at::Tensor HeadwiseMLPImpl::forward(const at::Tensor& x) const {
  // [B, H, T, in] @ [G, in, hidden] broadcasts G against H (G is H or 1).
  auto hidden = at::silu(at::matmul(x, w1.transpose(-1, -2)) + b1.unsqueeze(-2));
  return at::matmul(hidden, w2.transpose(-1, -2)) + b2.unsqueeze(-2);
}

double HeadwiseMLPImpl::default_init_bound(int64_t fan_in) { return 1.0 / std::sqrt(static_cast<double>(fan_in)); }

int64_t HeadwiseMLPImpl::parameter_count(int64_t groups, int64_t in, int64_t hidden, int64_t out) {
  return groups * (hidden * in + hidden + out * hidden + out);
}

int64_t HeadwiseMLPImpl::parameter_count() const {
  return parameter_count(w1.size(0), w1.size(2), w1.size(1), w2.size(1));
}

}  // namespace cqk
