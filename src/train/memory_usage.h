#pragma once
// Memory figures for the training log: the process's resident set and, on a
// GPU, the caching allocator's peak since the previous reading.
#include <c10/core/Device.h>

#include <nlohmann/json.hpp>
#include <string>

namespace cqk {

// {"rss_mb": ...} and, on CUDA, "cuda_peak_mb" (allocated bytes' peak since the
// last call on `device`; the peak is reset here).
nlohmann::json memory_usage(const c10::Device& device);

// On CUDA: start recording the allocator's history (for a snapshot later);
// elsewhere throws std::invalid_argument naming the flag.
void record_cuda_memory_history(const c10::Device& device);
// The allocator snapshot, pickled, for https://pytorch.org/memory_viz; written to `path`.
void write_cuda_memory_snapshot(const std::string& path);

}  // namespace cqk
