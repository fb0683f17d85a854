#pragma once
// Initialisation keyed by parameter name: every parameter draws its initial
// values from a generator of its own, seeded by (seed, its full name), so
// adding, removing or resizing one module leaves every other parameter's
// initial values unchanged. Base and coupled models of one seed then start
// from the same weights for every parameter they share (docs/EXPERIMENTS.md,
// the paired design).
#include <torch/nn/module.h>

#include <cstdint>
#include <string>

#include "cqk/config.h"

namespace cqk {

// The seed of the generator that initialises the parameter `name`.
uint64_t parameter_seed(uint64_t seed, const std::string& name);

// Draws every randomly initialised parameter of `model` (a TransformerLM built
// from `config`) again from its keyed generator; parameters with a fixed
// initial value (norm weights, the coupling's zero output layer, MTA's delta
// kernel, biases) keep it.
void initialise_parameters(torch::nn::Module& model, const ModelConfig& config, uint64_t seed);

}  // namespace cqk
