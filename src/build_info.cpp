#include "cqk/build_info.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/cuda.h>
#include <torch/version.h>
#ifdef CQK_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>
#endif

#include <sstream>

#include "simd/simd_variants.h"

namespace cqk {

namespace {
// at::show_config() lists the build settings, among them "BLAS_INFO=<name>".
std::string blas_name() {
  const std::string config = at::show_config();
  const std::string key = "BLAS_INFO=";
  const auto begin = config.find(key);
  if (begin == std::string::npos) return "unknown";
  const auto end = config.find_first_of(", \n", begin + key.size());
  return config.substr(begin + key.size(), end - begin - key.size());
}

// CUDA's encoding: 1000 * major + 10 * minor (13000 -> "13.0").
std::string cuda_version(long v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }
}  // namespace

BuildInfo build_info() {
  BuildInfo info;
  info.cqk_version = CQK_VERSION;
  info.torch_version = TORCH_VERSION;
  const auto& hooks = at::detail::getCUDAHooks();
  if (hooks.hasCUDART()) {  // libtorch_cuda is loaded; both versions are its build's, no device needed
    info.cuda_runtime = cuda_version(hooks.versionCUDART());
    if (hooks.hasCuDNN()) {
      const long v = hooks.versionCuDNN();  // 10000 * major + 100 * minor + patch (cuDNN 9)
      info.cudnn = std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." + std::to_string(v % 100);
    }
  }
  info.gpus_visible = static_cast<int>(torch::cuda::device_count());
#ifdef CQK_WITH_CUDA
  info.cuda_compiled = true;
  info.kernel_architectures = CQK_KERNEL_ARCHITECTURES;
  int driver = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0) info.cuda_driver = cuda_version(driver);
  for (int i = 0; i < info.gpus_visible; ++i) {
    const auto* p = at::cuda::getDeviceProperties(i);
    std::ostringstream gpu;
    gpu << p->name << " (sm_" << p->major << p->minor << ", " << p->multiProcessorCount << " SMs, "
        << (p->totalGlobalMem >> 20) << " MiB)";
    info.gpus.push_back(gpu.str());
  }
#endif
  info.cpu_threads = at::get_num_threads();
  info.blas = blas_name();
  info.cpu_kernels = cpu::simd_variant();
  return info;
}

std::string describe(const BuildInfo& info) {
  std::ostringstream out;
  out << "cqk " << info.cqk_version << "\n"
      << "libtorch " << info.torch_version << "\n"
      << "cuda kernels: " << (info.cuda_compiled ? "compiled in (sm " + info.kernel_architectures + ")" : "not compiled")
      << "\n"
      << "cuda: " << (info.cuda_runtime.empty() ? "none (CPU-only libtorch)" : "runtime " + info.cuda_runtime)
      << ", driver " << (info.cuda_driver.empty() ? "none" : info.cuda_driver) << "\n"
      << "cudnn: " << (info.cudnn.empty() ? "none" : info.cudnn) << "\n"
      << "gpus visible: " << info.gpus_visible << (info.gpus_visible == 0 ? " (no CUDA device)" : "") << "\n";
  for (size_t i = 0; i < info.gpus.size(); ++i) out << "gpu " << i << ": " << info.gpus[i] << "\n";
  out << "cpu threads: " << info.cpu_threads << "\n"
      << "cpu blas: " << info.blas << "\n"
      << "cpu kernels: " << info.cpu_kernels << "\n";
  return out.str();
}

}  // namespace cqk
