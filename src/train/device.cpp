#include "cqk/device.h"

#include <ATen/autocast_mode.h>
#include <torch/cuda.h>

#include <stdexcept>

namespace cqk {

c10::Device choose_device(DeviceChoice choice, const std::string& setting) {
  const bool cuda = torch::cuda::is_available();
  if (choice == DeviceChoice::Cuda && !cuda) throw std::invalid_argument(setting + ": cuda requested but no GPU is visible");
  if (choice == DeviceChoice::Cpu || !cuda) return c10::Device(c10::kCPU);
  return c10::Device(c10::kCUDA, 0);
}

bool use_bf16(const TrainConfig& train, const c10::Device& device) {
  return train.dtype == Precision::Bf16 || (train.dtype == Precision::Auto && device.is_cuda());
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
