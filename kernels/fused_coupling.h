#pragma once
// Host launchers for the fused coupling kernels. Raw pointers only, so that
// neither side of the boundary needs the other's headers.
#include <cstdint>

namespace cqk::kernels {

// Weights of an affine coupling: per step, per head (or one head when shared),
// the tensors of cqk::HeadwiseMLP, contiguous float32 on the device.
struct AffineCouplingParams {
  static constexpr int kMaxSteps = 8;
  const float* w1[kMaxSteps];
  const float* b1[kMaxSteps];
  const float* w2[kMaxSteps];
  const float* b2[kMaxSteps];
  int num_steps = 0;
  bool shared_across_heads = false;
  float clamp = 2.0f;
};

// Shapes a launcher supports; other shapes fall back to the ATen path.
bool fused_coupling_supported(int64_t head_dim, int64_t hidden);

// q, k: [batch, heads, time, head_dim] contiguous float32 on the device.
// Writes the coupled (forward) or reconstructed (inverse) q and k to q_out, k_out.
void affine_coupling_forward_cuda(const float* q, const float* k, float* q_out, float* k_out, int64_t batch,
                                  int64_t heads, int64_t time, int64_t head_dim, int64_t hidden,
                                  const AffineCouplingParams& params, void* stream);
void affine_coupling_inverse_cuda(const float* q, const float* k, float* q_out, float* k_out, int64_t batch,
                                  int64_t heads, int64_t time, int64_t head_dim, int64_t hidden,
                                  const AffineCouplingParams& params, void* stream);

}  // namespace cqk::kernels
