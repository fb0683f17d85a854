// A project outside cqk's tree that links the installed library: it runs a
// coupled Differential attention forward and backward.
#include <cqk/cqk.h>

#include <iostream>

int main() {
  cqk::configure_threads(1);
  std::cout << cqk::describe(cqk::build_info());
  auto options = cqk::AttentionOptions(64, 4).kind(cqk::AttentionKind::Differential);
  options.coupling(cqk::CouplingOptions().kind(cqk::CouplingKind::Affine));
  cqk::Attention attention(options);
  auto x = at::randn({2, 16, 64}).requires_grad_();
  auto y = attention->forward(x);
  y.pow(2).mean().backward();
  const bool ok = y.sizes() == x.sizes() && x.grad().defined() && x.grad().abs().sum().item<double>() > 0 &&
                  attention->coupling_->parameters()[0].grad().defined();
  std::cout << "coupled differential attention forward/backward: " << (ok ? "ok" : "FAILED") << "\n";
  return ok ? 0 : 1;
}
