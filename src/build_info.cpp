#include "cqk/build_info.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <sstream>

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
}  // namespace

BuildInfo build_info() {
  BuildInfo info;
  info.cqk_version = CQK_VERSION;
  info.torch_version = TORCH_VERSION;
#ifdef CQK_WITH_CUDA
  info.cuda_compiled = true;
#endif
  info.gpus_visible = static_cast<int>(torch::cuda::device_count());
  info.cpu_threads = at::get_num_threads();
  info.blas = blas_name();
  return info;
}

std::string describe(const BuildInfo& info) {
  std::ostringstream out;
  out << "cqk " << info.cqk_version << "\n"
      << "libtorch " << info.torch_version << "\n"
      << "cuda kernels: " << (info.cuda_compiled ? "compiled in" : "not compiled") << "\n"
      << "gpus visible: " << info.gpus_visible << "\n"
      << "cpu threads: " << info.cpu_threads << "\n"
      << "cpu blas: " << info.blas << "\n";
  return out.str();
}

}  // namespace cqk
