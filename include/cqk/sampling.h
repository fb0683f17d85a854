#pragma once
// Choosing the next token from a model's logits, for `cqk generate`:
// temperature scaling, top-k filtering, greedy decoding at temperature 0, and
// a caller-owned generator so that a seed gives the same tokens every time.
//
//   auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
//   at::Tensor next = cqk::sample_next(logits[0][-1], {0.8, 40}, generator);
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace cqk {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy (argmax); must not be negative
  int64_t top_k = 0;         // > 0: sample among the k largest logits only; 0: all
};

// logits: [..., vocab] (any floating dtype, any device) -> int64 token ids of
// shape [...] on the logits' device. Sampling draws from `generator` (its
// device must be the CPU or the logits' device); greedy decoding never touches it.
// Ties at the k-th largest logit keep every tied token. Throws
// std::invalid_argument on a negative temperature or top_k, or empty logits.
at::Tensor sample_next(const at::Tensor& logits, const SamplingOptions& options, at::Generator& generator);

}  // namespace cqk
