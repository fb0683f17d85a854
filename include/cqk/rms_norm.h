#pragma once
// RMSNorm over the last dimension with a learned scale (initialised to 1).
// On float32 CPU tensors (x86-64 with AVX2) it runs one-pass CPU kernels
// forward and backward (src/simd/rms_norm_cpu.h) and saves x and one float per
// row; elsewhere, and with CQK_FUSED_RMS_NORM=0 or
// set_fused_rms_norm_enabled(false), the ATen ops (statistics in float32 at
// least).
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace cqk {

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x) const;
  double eps() const { return eps_; }

  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

bool fused_rms_norm_enabled();
void set_fused_rms_norm_enabled(bool enabled);

}  // namespace cqk
