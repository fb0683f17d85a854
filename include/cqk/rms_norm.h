#pragma once
// RMSNorm over the last dimension with a learned scale (initialised to 1).
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace cqk {

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x) const;

  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

}  // namespace cqk
