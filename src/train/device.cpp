#include "cqk/device.h"

#include <ATen/autocast_mode.h>
#include <torch/cuda.h>

#include <stdexcept>

namespace cqk {

c10::Device choose_device(const std::string& name, const std::string& setting) {
  const bool cuda = torch::cuda::is_available();
  if (name == "cuda" && !cuda) throw std::invalid_argument(setting + ": cuda requested but no GPU is visible");
  if (name == "cpu" || (name == "auto" && !cuda)) return c10::Device(c10::kCPU);
  if (name == "cuda" || name == "auto") return c10::Device(c10::kCUDA, 0);
  throw std::invalid_argument(setting + ": expected auto|cpu|cuda, got '" + name + "'");
}

bool use_bf16(const TrainConfig& train, const c10::Device& device) {
  if (train.dtype == "auto") return device.is_cuda();
  if (train.dtype == "bf16") return true;
  if (train.dtype == "fp32") return false;
  throw std::invalid_argument("train.dtype: expected auto|fp32|bf16, got '" + train.dtype + "'");
}

AutocastScope::AutocastScope(const c10::Device& device, bool enabled) : type_(device.type()), enabled_(enabled) {
  if (!enabled_) return;
  previous_ = at::autocast::is_autocast_enabled(type_);
  at::autocast::set_autocast_dtype(type_, at::kBFloat16);
  at::autocast::set_autocast_enabled(type_, true);
}

AutocastScope::~AutocastScope() {
  if (!enabled_) return;
  at::autocast::set_autocast_enabled(type_, previous_);
  at::autocast::clear_cache();
}

}  // namespace cqk
