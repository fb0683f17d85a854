#pragma once
// A two-layer SiLU MLP with its own weights per head, applied token-wise:
//   y = W2 silu(W1 x + b1) + b2,  x: [batch, heads, time, in] -> [batch, heads, time, out]
// With `groups` = 1 one set of weights serves every head.
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace cqk {

class HeadwiseMLPImpl : public torch::nn::Module {
 public:
  // zero_output: W2 = b2 = 0, so the MLP outputs exactly zero at init.
  HeadwiseMLPImpl(int64_t groups, int64_t in, int64_t hidden, int64_t out, bool zero_output);

  at::Tensor forward(const at::Tensor& x) const;
  int64_t parameter_count() const;
  static int64_t parameter_count(int64_t groups, int64_t in, int64_t hidden, int64_t out);
  // A linear layer's default initialisation, U(-b, b) with b = 1/sqrt(fan_in).
  static double default_init_bound(int64_t fan_in);

  at::Tensor w1, b1, w2, b2;  // [G, hidden, in], [G, hidden], [G, out, hidden], [G, out]
};
TORCH_MODULE(HeadwiseMLP);

}  // namespace cqk
