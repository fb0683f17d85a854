#include "model/initialisation.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <optional>

#include "cqk/attention.h"
#include "cqk/headwise_mlp.h"
#include "support/seed_mixing.h"

namespace cqk {
namespace {

bool contains(const std::string& name, const char* part) { return name.find(part) != std::string::npos; }

bool ends_with(const std::string& name, const std::string& suffix) {
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// How a parameter's initial values are drawn: N(a, b^2), or U(a, b).
struct Distribution {
  bool uniform = false;
  double a = 0, b = 0;
};

// The distribution of the parameter `name` of shape `sizes`, or nullopt for a
// parameter whose initial value is fixed. The one place that knows each
// parameter's distribution by its name; a test builds models under different
// global seeds to catch a random parameter missing here.
std::optional<Distribution> initial_distribution(const std::string& name, at::IntArrayRef sizes,
                                                 const ModelConfig& config) {
  const double std = config.init_std;
  // Projections that write into the residual stream are scaled down by sqrt(2 * layers) (GPT-2).
  const double residual_std = std / std::sqrt(2.0 * static_cast<double>(config.layers));
  if (name == "embedding.weight") return Distribution{false, 0.0, std};
  if (contains(name, ".coupling.")) {
    // The conditioners' first layers; their output layers are zero (identity at init).
    if (!ends_with(name, ".w1")) return std::nullopt;
    const double bound = HeadwiseMLPImpl::default_init_bound(sizes.back());
    return Distribution{true, -bound, bound};
  }
  if (contains(name, "_proj.weight") || contains(name, "mlp.")) {
    const bool residual = contains(name, "out_proj.") || contains(name, "mlp.down.");
    return Distribution{false, 0.0, residual ? residual_std : std};
  }
  if (contains(name, ".lambda_")) return Distribution{false, 0.0, kDifferentialLambdaInitStd};
  return std::nullopt;
}

}  // namespace

uint64_t parameter_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the name
  for (const unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  return splitmix64(splitmix64(seed) ^ h);
}

void initialise_parameters(torch::nn::Module& model, const ModelConfig& config, uint64_t seed) {
  at::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    const auto d = initial_distribution(item.key(), item.value().sizes(), config);
    if (!d) continue;
    auto generator = at::make_generator<at::CPUGeneratorImpl>(parameter_seed(seed, item.key()));
    // Drawn on the CPU in float32 so that the values do not depend on the device.
    auto values = at::empty(item.value().sizes(), at::kFloat);
    if (d->uniform) values.uniform_(d->a, d->b, generator);
    else values.normal_(d->a, d->b, generator);
    item.value().copy_(values);
  }
}

}  // namespace cqk
