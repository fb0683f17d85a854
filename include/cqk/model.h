#pragma once
// The GPT-style decoder: tied token embedding, pre-norm blocks (RMSNorm,
// attention with optional coupling, MLP GELU or SwiGLU), RoPE in attention.
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <string>

#include "cqk/attention.h"
#include "cqk/config.h"
#include "cqk/rms_norm.h"

namespace cqk {

// The MLP hidden size: model.mlp_hidden, or by default 4*width for GELU and
// 8/3*width rounded up to a multiple of 64 for SwiGLU.
int64_t mlp_hidden_size(const ModelConfig& config);

class MLPImpl : public torch::nn::Module {
 public:
  MLPImpl(int64_t width, int64_t hidden, bool swiglu);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::Linear up{nullptr}, gate{nullptr}, down{nullptr};  // gate only for SwiGLU
};
TORCH_MODULE(MLP);

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const ModelConfig& config, int64_t layer);
  at::Tensor forward(const at::Tensor& x);

  RMSNorm attention_norm{nullptr}, mlp_norm{nullptr};
  Attention attention{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(Block);

struct ParameterBreakdown {
  int64_t embedding = 0, attention = 0, coupling = 0, mlp = 0, norm = 0;
  int64_t total() const { return embedding + attention + coupling + mlp + norm; }
  std::string describe() const;  // one line, counts in millions
};

// The seed torch's default CPU generator was last seeded with (the trainer
// seeds it with run.seed before it builds the model).
uint64_t default_init_seed();

class TransformerLMImpl : public torch::nn::Module {
 public:
  // Every parameter is initialised from a generator keyed by (init_seed, its
  // name), independent of the rest of the model (src/model/initialisation.h).
  explicit TransformerLMImpl(const ModelConfig& config, uint64_t init_seed = default_init_seed());

  // tokens: [batch, time] int64 -> logits [batch, time, vocab].
  at::Tensor forward(const at::Tensor& tokens);
  // Mean cross entropy over targets != kIgnoredTarget (-100, as PyTorch; linear_cross_entropy: the logits are not kept).
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets);
  // tokens -> the final-normed hidden states [batch, time, width] that the head reads.
  at::Tensor final_hidden(const at::Tensor& tokens);

  ParameterBreakdown parameter_breakdown() const;
  // Every layer's AttentionImpl::identity_initialised_parameters.
  std::vector<at::Tensor> identity_initialised_parameters() const;
  // Training FLOPs per token: 6 per parameter (forward and backward) plus the
  // attention scores, 12 * layers * width * seq_len (as in the PaLM appendix).
  double flops_per_token(int64_t seq_len) const;
  const ModelConfig& config() const { return config_; }

  torch::nn::Embedding embedding{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  RMSNorm final_norm{nullptr};

 private:
  ModelConfig config_;
};
TORCH_MODULE(TransformerLM);

}  // namespace cqk
