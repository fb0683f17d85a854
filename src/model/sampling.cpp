#include "cqk/sampling.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace cqk {

at::Tensor sample_next(const at::Tensor& logits, const SamplingOptions& options, at::Generator& generator) {
  if (!(options.temperature >= 0.0) || !std::isfinite(options.temperature))
    throw std::invalid_argument("sampling: temperature must be a finite number >= 0, got " +
                                std::to_string(options.temperature));
  if (options.top_k < 0)
    throw std::invalid_argument("sampling: top_k must be >= 0, got " + std::to_string(options.top_k));
  if (!logits.defined() || logits.dim() < 1 || logits.size(-1) == 0)
    throw std::invalid_argument("sampling: expected logits of shape [..., vocab] with vocab > 0");

  at::NoGradGuard no_grad;
  const int64_t vocab = logits.size(-1);
  // top_k 1 is greedy at any temperature.
  if (options.temperature == 0.0 || options.top_k == 1) return logits.argmax(-1);

  auto scaled = logits.detach().to(at::kFloat) / options.temperature;
  if (options.top_k > 0 && options.top_k < vocab) {
    const auto threshold = std::get<0>(scaled.topk(options.top_k, -1)).narrow(-1, options.top_k - 1, 1);
    scaled = scaled.masked_fill(scaled < threshold, -std::numeric_limits<float>::infinity());
  }
  const auto batch_shape = logits.sizes().slice(0, logits.dim() - 1).vec();
  auto probs = at::softmax(scaled, -1).reshape({-1, vocab});
  if (probs.device() != generator.device()) probs = probs.to(generator.device());
  const auto ids = at::multinomial(probs, 1, /*replacement=*/false, generator);
  return ids.reshape(batch_shape).to(logits.device());
}

}  // namespace cqk
