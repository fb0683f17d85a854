#pragma once
// Where and in which precision a run computes (train.device, train.dtype): one
// set of rules for the trainer, the benchmark and the commands that load a run.
#include <c10/core/Device.h>

#include <string>

#include "cqk/config.h"

namespace cqk {

// auto: a GPU when one is visible, else the CPU; cuda: GPU 0. Throws
// std::invalid_argument naming `setting` (e.g. "train.device") for cuda
// without a visible GPU.
c10::Device choose_device(DeviceChoice choice, const std::string& setting = "train.device");

// Whether the forward pass runs under bf16 autocast: train.dtype bf16, or auto on a GPU.
bool use_bf16(const TrainConfig& train, const c10::Device& device);

// bf16 autocast on `device` for its lifetime, when enabled (the forward pass).
class AutocastScope {
 public:
  AutocastScope(const c10::Device& device, bool enabled);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType type_;
  bool enabled_;
  bool previous_ = false;
};

}  // namespace cqk
