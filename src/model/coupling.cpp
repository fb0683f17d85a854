#include "cqk/coupling.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "model/option_checks.h"
#include "ops/qk_path.h"

namespace cqk {

namespace {

int64_t groups(const CouplingOptions& o) { return o.shared_across_heads() ? 1 : o.num_heads(); }

int64_t affine_parameter_count(const CouplingOptions& o) {
  return o.steps() * HeadwiseMLPImpl::parameter_count(groups(o), o.head_dim(), o.hidden(), 2 * o.head_dim());
}

// The width r' whose parameter count `count(r')` is closest to `target`.
template <typename Count>
int64_t closest_width(int64_t target, Count count) {
  int64_t best = 1;
  for (int64_t r = 1; count(r) <= 2 * target; ++r) {
    if (std::llabs(count(r) - target) < std::llabs(count(best) - target)) best = r;
  }
  return best;
}

// Splits the conditioner output [.., 2d] into a soft-clamped log-scale and a shift.
std::pair<at::Tensor, at::Tensor> scale_and_shift(const at::Tensor& conditioner_out, double clamp) {
  auto parts = conditioner_out.chunk(2, -1);
  return {at::tanh(parts[0] / clamp) * clamp, parts[1]};
}

}  // namespace

bool is_invertible(const CouplingOptions& o) {
  switch (o.kind()) {
    case CouplingKind::None:
    case CouplingKind::Affine: return true;
    case CouplingKind::Dynamics: return o.integrator() == Integrator::Symplectic;
    default: return false;
  }
}

int64_t coupling_hidden_width(const CouplingOptions& o) {
  const int64_t d = o.head_dim(), g = groups(o), target = affine_parameter_count(o);
  switch (o.kind()) {
    case CouplingKind::NonInvertible:
      return closest_width(target, [&](int64_t r) { return HeadwiseMLPImpl::parameter_count(g, 2 * d, r, 2 * d); });
    case CouplingKind::Uncoupled:
      return closest_width(target, [&](int64_t r) { return 2 * HeadwiseMLPImpl::parameter_count(g, d, r, d); });
    case CouplingKind::Dynamics:
      return closest_width(target, [&](int64_t r) { return HeadwiseMLPImpl::parameter_count(g, d, r, d) + g; });
    default: return o.hidden();
  }
}

int64_t coupling_parameter_count(const CouplingOptions& o) {
  const int64_t d = o.head_dim(), g = groups(o), r = coupling_hidden_width(o);
  switch (o.kind()) {
    case CouplingKind::None: return 0;
    case CouplingKind::Affine: return affine_parameter_count(o);
    case CouplingKind::NonInvertible: return HeadwiseMLPImpl::parameter_count(g, 2 * d, r, 2 * d);
    case CouplingKind::Uncoupled: return 2 * HeadwiseMLPImpl::parameter_count(g, d, r, d);
    case CouplingKind::Dynamics: return HeadwiseMLPImpl::parameter_count(g, d, r, d) + g;
  }
  return 0;
}

QKCouplingImpl::QKCouplingImpl(const CouplingOptions& options) : options_(options) {
  const int64_t d = options.head_dim(), g = groups(options), r = coupling_hidden_width(options);
  check_positive_sizes("coupling", {{"num_heads", options.num_heads()},
                                    {"head_dim", d},
                                    {"hidden", options.hidden()},
                                    {"steps", options.steps()}});
  check_positive_finite("coupling", "clamp", options.clamp());
  // Output layers start at zero, so every kind but Dynamics-with-dt starts as the identity.
  auto add = [&](int64_t in, int64_t out) {
    conditioners_.push_back(
        register_module("conditioner" + std::to_string(conditioners_.size()), HeadwiseMLP(g, in, r, out, true)));
  };
  switch (options.kind()) {
    case CouplingKind::None: break;
    case CouplingKind::Affine:
      for (int64_t i = 0; i < options.steps(); ++i) add(d, 2 * d);
      break;
    case CouplingKind::NonInvertible: add(2 * d, 2 * d); break;
    case CouplingKind::Uncoupled:
      add(d, d);
      add(d, d);
      break;
    case CouplingKind::Dynamics:
      add(d, d);
      dt_ = register_parameter("dt", at::full({g}, options.dt_init()));
      break;
  }
}

int64_t QKCouplingImpl::parameter_count() const {
  int64_t count = 0;
  for (const auto& p : parameters()) count += p.numel();
  return count;
}

void QKCouplingImpl::check_input(const at::Tensor& q, const at::Tensor& k, const char* where) const {
  const auto expect = [&](const at::Tensor& t, const char* name) {
    if (t.dim() != 4 || t.size(1) != options_.num_heads() || t.size(3) != options_.head_dim())
      throw std::invalid_argument(std::string("coupling ") + where + ": " + name +
                                  " must be [batch, " + std::to_string(options_.num_heads()) + ", time, " +
                                  std::to_string(options_.head_dim()) + "], got " + c10::str(t.sizes()));
  };
  expect(q, "q");
  expect(k, "k");
  if (q.sizes() != k.sizes())
    throw std::invalid_argument(std::string("coupling ") + where + ": q " + c10::str(q.sizes()) + " and k " +
                                c10::str(k.sizes()) + " differ");
}

std::pair<at::Tensor, at::Tensor> QKCouplingImpl::transform(at::Tensor q, at::Tensor k,
                                                            std::vector<at::Tensor>* log_scales) const {
  const double c = options_.clamp();
  switch (options_.kind()) {
    case CouplingKind::None: break;
    case CouplingKind::Affine:
      for (size_t i = 0; i < conditioners_.size(); ++i) {
        // Even steps update k conditioned on q, odd steps q conditioned on k.
        at::Tensor& target = (i % 2 == 0) ? k : q;
        const at::Tensor& given = (i % 2 == 0) ? q : k;
        auto [s, t] = scale_and_shift(conditioners_[i]->forward(given), c);
        target = target * at::exp(s) + t;
        if (log_scales) log_scales->push_back(s);
      }
      break;
    case CouplingKind::NonInvertible: {
      auto both = at::cat({q, k}, -1);
      auto updated = both + conditioners_[0]->forward(both);
      // Outputs keep the inputs' memory layout, so downstream kernels (and their
      // rounding) are the same as without coupling.
      auto parts = updated.chunk(2, -1);
      q = at::empty_like(q).copy_(parts[0]);
      k = at::empty_like(k).copy_(parts[1]);
      break;
    }
    case CouplingKind::Uncoupled: {
      auto q_new = q + conditioners_[0]->forward(q);
      k = k + conditioners_[1]->forward(k);
      q = q_new;
      break;
    }
    case CouplingKind::Dynamics: {
      const auto dt = dt_.view({1, -1, 1, 1});
      for (int64_t i = 0; i < options_.steps(); ++i) {
        auto q_new = q + dt * k;
        // Symplectic (semi-implicit) Euler uses the updated q, which makes the step invertible.
        const auto& q_force = options_.integrator() == Integrator::Symplectic ? q_new : q;
        k = k + dt * conditioners_[0]->forward(q_force);
        q = q_new;
      }
      break;
    }
  }
  return {q, k};
}

std::pair<at::Tensor, at::Tensor> QKCouplingImpl::inverse_transform(at::Tensor q, at::Tensor k) const {
  if (!is_invertible(options_))
    throw std::logic_error("coupling kind '" + to_string(options_.kind()) +
                           (options_.kind() == CouplingKind::Dynamics ? "' with the euler integrator" : "'") +
                           " has no inverse");
  const double c = options_.clamp();
  if (options_.kind() == CouplingKind::Affine) {
    for (size_t i = conditioners_.size(); i-- > 0;) {
      at::Tensor& target = (i % 2 == 0) ? k : q;
      const at::Tensor& given = (i % 2 == 0) ? q : k;
      auto [s, t] = scale_and_shift(conditioners_[i]->forward(given), c);
      target = (target - t) * at::exp(-s);
    }
  } else if (options_.kind() == CouplingKind::Dynamics) {
    const auto dt = dt_.view({1, -1, 1, 1});
    for (int64_t i = 0; i < options_.steps(); ++i) {
      k = k - dt * conditioners_[0]->forward(q);
      q = q - dt * k;
    }
  }
  return {q, k};
}

std::pair<at::Tensor, at::Tensor> QKCouplingImpl::forward(const at::Tensor& q, const at::Tensor& k) {
  check_input(q, k, "forward");
  return ops::couple(*this, q, k);
}

std::pair<at::Tensor, at::Tensor> QKCouplingImpl::inverse(const at::Tensor& q, const at::Tensor& k) {
  check_input(q, k, "inverse");
  return inverse_transform(q, k);
}

}  // namespace cqk
