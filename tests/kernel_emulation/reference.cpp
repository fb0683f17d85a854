#include "reference.h"

#include <cmath>

namespace cqk::emulation {

CouplingWeights random_coupling(int steps, int64_t groups, int64_t head_dim, int64_t hidden) {
  CouplingWeights w;
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  for (int i = 0; i < steps; ++i) {
    w.w1.push_back(at::randn({groups, hidden, head_dim}, f32) * 0.15);
    w.b1.push_back(at::randn({groups, hidden}, f32) * 0.1);
    w.w2.push_back(at::randn({groups, 2 * head_dim, hidden}, f32) * 0.2);
    w.b2.push_back(at::randn({groups, 2 * head_dim}, f32) * 0.1);
  }
  return w;
}

CouplingWeights zeros_like(const CouplingWeights& w) {
  CouplingWeights g;
  for (int i = 0; i < w.steps(); ++i) {
    g.w1.push_back(at::zeros_like(w.w1[i]));
    g.b1.push_back(at::zeros_like(w.b1[i]));
    g.w2.push_back(at::zeros_like(w.w2[i]));
    g.b2.push_back(at::zeros_like(w.b2[i]));
  }
  return g;
}

CouplingWeights to_double(const CouplingWeights& w, bool requires_grad) {
  CouplingWeights d;
  auto convert = [&](const at::Tensor& t) { return t.to(at::kDouble).detach().set_requires_grad(requires_grad); };
  for (int i = 0; i < w.steps(); ++i) {
    d.w1.push_back(convert(w.w1[i]));
    d.b1.push_back(convert(w.b1[i]));
    d.w2.push_back(convert(w.w2[i]));
    d.b2.push_back(convert(w.b2[i]));
  }
  return d;
}

std::pair<at::Tensor, at::Tensor> reference_coupling(const at::Tensor& q, const at::Tensor& k,
                                                     const CouplingWeights& w,
                                                     const std::vector<int64_t>& group_of_head, double clamp) {
  const int64_t D = q.size(-1);
  const auto index = at::tensor(group_of_head, at::kLong);
  at::Tensor qs = q, ks = k;
  for (int i = 0; i < w.steps(); ++i) {
    // Per head: [H, R, D], [H, R], [H, 2D, R], [H, 2D].
    const at::Tensor w1 = w.w1[i].index_select(0, index), b1 = w.b1[i].index_select(0, index);
    const at::Tensor w2 = w.w2[i].index_select(0, index), b2 = w.b2[i].index_select(0, index);
    const bool even = i % 2 == 0;  // even steps update k from q
    const at::Tensor& x = even ? qs : ks;
    const at::Tensor a = at::einsum("bhtd,hrd->bhtr", {x, w1}) + b1.unsqueeze(0).unsqueeze(2);
    const at::Tensor h = a * at::sigmoid(a);
    const at::Tensor o = at::einsum("bhtr,hmr->bhtm", {h, w2}) + b2.unsqueeze(0).unsqueeze(2);
    const at::Tensor s = clamp * at::tanh(o.narrow(-1, 0, D) / clamp);
    const at::Tensor t = o.narrow(-1, D, D);
    if (even) ks = ks * at::exp(s) + t;
    else qs = qs * at::exp(s) + t;
  }
  return {qs, ks};
}

at::Tensor reference_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * w;
}

at::Tensor reference_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor c = cos.to(at::kDouble), s = sin.to(at::kDouble);
  const at::Tensor lo = x.narrow(-1, 0, half), hi = x.narrow(-1, half, half);
  return at::cat({lo * c - hi * s, hi * c + lo * s}, -1);
}

std::pair<at::Tensor, at::Tensor> rope_tables(int64_t time, int64_t head_dim, double base) {
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor inv_freq = at::pow(base, -at::arange(0, head_dim / 2, f64) * 2.0 / head_dim);
  const at::Tensor angles = at::outer(at::arange(time, f64), inv_freq);
  return {at::cos(angles).to(at::kFloat).contiguous(), at::sin(angles).to(at::kFloat).contiguous()};
}

}  // namespace cqk::emulation
