#include "train/memory_usage.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "cqk/atomic_file.h"

#ifdef CQK_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/cuda/memory_snapshot.h>
#endif

namespace cqk {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// Resident pages (the second field of /proc/self/statm); 0 where there is no procfs.
double resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  long long size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0.0;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

}  // namespace

nlohmann::json memory_usage(const c10::Device& device) {
  nlohmann::json usage = {{"rss_mb", resident_bytes() / kMiB}};
#ifdef CQK_WITH_CUDA
  if (device.is_cuda()) {
    namespace allocator = c10::cuda::CUDACachingAllocator;
    const auto stats = allocator::getDeviceStats(device.index());
    usage["cuda_peak_mb"] =
        static_cast<double>(stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak) /
        kMiB;
    allocator::resetPeakStats(device.index());
  }
#else
  (void)device;
#endif
  return usage;
}

void record_cuda_memory_history(const c10::Device& device) {
  if (!device.is_cuda()) throw std::invalid_argument("--memory-snapshot-step: needs a CUDA device (the run is on " + device.str() + ")");
#ifdef CQK_WITH_CUDA
  torch::cuda::_record_memory_history(std::optional<std::string>("all"), std::optional<std::string>("all"), "all");
#else
  throw std::invalid_argument("--memory-snapshot-step: this cqk was built without CUDA");
#endif
}

void write_cuda_memory_snapshot(const std::string& path) {
#ifdef CQK_WITH_CUDA
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  write_file_atomically(path, torch::cuda::_memory_snapshot_pickled());
#else
  (void)path;
#endif
}

}  // namespace cqk
