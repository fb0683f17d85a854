#pragma once
// RoPE (rotate-half) as the kernels apply it to a token whose channels are
// spread over lanes (coupling_math.cuh: lane l holds channels 8l .. 8l+7),
// shared by the fused coupling kernels, the CPU kernel and their tests.
// Channel c's partner is c + D/2 (lower half) or c - D/2 (upper half), which
// lives in lane l ^ L/2; the tables hold cos and sin per (position, frequency),
// [time, D/2] float32, as cqk::rope_tables makes them.
#include <cstdint>

#include "coupling_math.cuh"  // CQK_HOST_DEVICE, kLaneChannels
#include "coupling_kernels.h"   // RopeTables

namespace cqk::kernels {

// Channel c rotated with its partner:
//   lower half: x_c cos - x_partner sin;  upper half: x_c cos + x_partner sin.
// The transpose (the backward, and the inverse) is the same with -sin.
CQK_HOST_DEVICE float rope_channel(float x, float partner, float cos_a, float sin_a, bool upper_half) {
  return upper_half ? x * cos_a + partner * sin_a : x * cos_a - partner * sin_a;
}

// A lane's channels c0 .. c0+7 at position t, rotated (or, with `transpose`,
// rotated back). `exchange(x, partner)` fills partner[i] with the value of
// channel (c0 + i) ^ D/2 from the partner lane; every lane of the token must
// call it together (on the GPU it is a warp shuffle).
template <int D, class Exchange>
CQK_HOST_DEVICE void rope_lane(float (&x)[kLaneChannels], int64_t t, int c0, const RopeTables& rope, bool transpose,
                               const Exchange& exchange) {
  constexpr int Half = D / 2;
  float partner[kLaneChannels];
  exchange(x, partner);
  const bool upper = c0 >= Half;
  const int64_t f0 = t * Half + (upper ? c0 - Half : c0);
  CQK_UNROLL
  for (int i = 0; i < kLaneChannels; ++i) {
    const float sin_a = transpose ? -rope.sin[f0 + i] : rope.sin[f0 + i];
    x[i] = rope_channel(x[i], partner[i], rope.cos[f0 + i], sin_a, upper);
  }
}

}  // namespace cqk::kernels
