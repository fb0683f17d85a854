#include "gradient_check.h"

#include <cmath>
#include <sstream>

namespace cqk::testing {

GradientCheckResult check_gradients(const std::function<at::Tensor()>& f, const std::vector<at::Tensor>& inputs,
                                    int samples_per_input, double eps, double atol, double rtol) {
  at::Tensor weights;
  {
    at::NoGradGuard no_grad;
    weights = at::randn_like(f());
  }
  const auto loss = [&] { return (f() * weights).sum(); };
  const auto analytic = torch::autograd::grad({loss()}, inputs, {}, false, false, /*allow_unused=*/true);

  GradientCheckResult result;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto flat = inputs[i].view(-1);
    const int64_t n = flat.numel();
    for (int s = 0; s < samples_per_input && s < n; ++s) {
      const int64_t index = n <= samples_per_input ? s : at::randint(n, {1}).item<int64_t>();
      const double original = flat[index].item<double>();
      flat[index].fill_(original + eps);
      const double plus = loss().item<double>();
      flat[index].fill_(original - eps);
      const double minus = loss().item<double>();
      flat[index].fill_(original);
      const double numeric = (plus - minus) / (2 * eps);
      const double exact = analytic[i].defined() ? analytic[i].reshape(-1)[index].item<double>() : 0.0;
      if (std::abs(numeric - exact) > atol + rtol * std::abs(numeric)) {
        std::ostringstream out;
        out << "input " << i << " element " << index << ": autograd " << exact << ", finite difference " << numeric;
        return {false, out.str()};
      }
    }
  }
  return result;
}

}  // namespace cqk::testing
