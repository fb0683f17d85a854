#include "cqk/model.h"

#include "cqk/linear_cross_entropy.h"
#include "cqk/swiglu.h"
#include "model/initialisation.h"
#include "model/option_checks.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/record_function.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace cqk {

MLPImpl::MLPImpl(int64_t width, int64_t hidden, bool swiglu) {
  check_positive_sizes("mlp", {{"width", width}, {"hidden", hidden}});
  const auto linear = [](int64_t in, int64_t out) { return torch::nn::LinearOptions(in, out).bias(false); };
  up = register_module("up", torch::nn::Linear(linear(width, hidden)));
  if (swiglu) gate = register_module("gate", torch::nn::Linear(linear(width, hidden)));
  down = register_module("down", torch::nn::Linear(linear(hidden, width)));
}

at::Tensor MLPImpl::forward(const at::Tensor& x) {
  RECORD_USER_SCOPE("cqk::mlp");  // a profiler range (train/step_profiler.h); free when none records
  if (gate) return down(swiglu(gate(x), up(x)));
  return down(at::gelu(up(x)));
}

int64_t mlp_hidden_size(const ModelConfig& config) {
  if (config.mlp_hidden > 0) return config.mlp_hidden;
  if (config.mlp == MlpKind::Gelu) return 4 * config.width;
  // SwiGLU keeps the parameter count of a 4x GELU MLP with 2/3 of the width, rounded up to 64.
  return (8 * config.width / 3 + 63) / 64 * 64;
}

BlockImpl::BlockImpl(const ModelConfig& config, int64_t layer) {
  attention_norm = register_module("attention_norm", RMSNorm(config.width, config.norm_eps));
  attention = register_module("attention", Attention(attention_options(config, layer)));
  mlp_norm = register_module("mlp_norm", RMSNorm(config.width, config.norm_eps));
  mlp = register_module("mlp", MLP(config.width, mlp_hidden_size(config), config.mlp == MlpKind::SwiGlu));
}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  const auto h = x + attention(attention_norm(x));
  return h + mlp(mlp_norm(h));
}

std::string ParameterBreakdown::describe() const {
  char line[256];
  std::snprintf(line, sizeof line,
                "parameters: %.3fM total = embedding %.3fM + attention %.3fM + coupling %.4fM + mlp %.3fM + "
                "norm %.4fM",
                total() / 1e6, embedding / 1e6, attention / 1e6, coupling / 1e6, mlp / 1e6, norm / 1e6);
  return line;
}

uint64_t default_init_seed() { return at::detail::getDefaultCPUGenerator().current_seed(); }

TransformerLMImpl::TransformerLMImpl(const ModelConfig& config, uint64_t init_seed) : config_(config) {
  if (config.vocab_size < 2) throw std::invalid_argument("model.vocab_size must be at least 2");
  if (config.layers < 1) throw std::invalid_argument("model.layers must be at least 1");
  if (const auto problem = model_shape_problem(config)) throw std::invalid_argument(problem->key + ": " + problem->what);
  embedding = register_module("embedding", torch::nn::Embedding(config.vocab_size, config.width));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t layer = 0; layer < config.layers; ++layer) blocks->push_back(Block(config, layer));
  final_norm = register_module("final_norm", RMSNorm(config.width, config.norm_eps));
  initialise_parameters(*this, config, init_seed);
}

at::Tensor TransformerLMImpl::final_hidden(const at::Tensor& tokens) {
  auto h = embedding(tokens);
  for (const auto& block : *blocks) h = block->as<Block>()->forward(h);
  return final_norm(h);
}

at::Tensor TransformerLMImpl::forward(const at::Tensor& tokens) {
  // The output head is the embedding (tied weights).
  return at::matmul(final_hidden(tokens), embedding->weight.t());
}

at::Tensor TransformerLMImpl::loss(const at::Tensor& tokens, const at::Tensor& targets) {
  const auto hidden = final_hidden(tokens);
  RECORD_USER_SCOPE("cqk::loss");
  return linear_cross_entropy(hidden.reshape({-1, hidden.size(-1)}), embedding->weight, targets.reshape(-1),
                              kIgnoredTarget);
}

std::vector<at::Tensor> TransformerLMImpl::identity_initialised_parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& block : *blocks) {
    const auto layer = block->as<Block>()->attention->identity_initialised_parameters();
    out.insert(out.end(), layer.begin(), layer.end());
  }
  return out;
}

ParameterBreakdown TransformerLMImpl::parameter_breakdown() const {
  ParameterBreakdown counts;
  for (const auto& item : named_parameters()) {
    const auto& name = item.key();
    const int64_t n = item.value().numel();
    if (name.rfind("embedding.", 0) == 0) counts.embedding += n;
    else if (name.find(".coupling.") != std::string::npos) counts.coupling += n;
    else if (name.find(".attention.") != std::string::npos) counts.attention += n;
    else if (name.find(".mlp.") != std::string::npos) counts.mlp += n;
    else counts.norm += n;
  }
  return counts;
}

double TransformerLMImpl::flops_per_token(int64_t seq_len) const {
  const auto counts = parameter_breakdown();
  return 6.0 * static_cast<double>(counts.total()) +
         12.0 * static_cast<double>(config_.layers * config_.width * seq_len);
}

}  // namespace cqk
