#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "cqk/build_info.h"
#include "cqk/runtime.h"
#include "test_io.h"

namespace {

TEST(Runtime, ConfigureThreadsSetsTorchThreadCount) {
  unsetenv("CQK_NUM_THREADS");
  EXPECT_EQ(cqk::configure_threads(1), 1);
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_EQ(cqk::configure_threads(0), cqk::available_cpus());
  setenv("CQK_NUM_THREADS", "1", 1);  // the environment (and --threads) wins over a config's value
  EXPECT_EQ(cqk::configure_threads(2), 1);
  unsetenv("CQK_NUM_THREADS");
}

TEST(Runtime, ConfigureThreadsRejectsAnEnvironmentValueThatIsNotAPositiveInteger) {
  for (const char* value : {"abc", "-3", "0", "2x", "99999999999"}) {
    SCOPED_TRACE(value);
    setenv("CQK_NUM_THREADS", value, 1);
    try {
      cqk::configure_threads(1);
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()), std::string("CQK_NUM_THREADS must be a positive integer, got '") + value + "'");
    }
  }
  setenv("CQK_NUM_THREADS", "", 1);  // empty: as if unset
  EXPECT_EQ(cqk::configure_threads(1), 1);
  unsetenv("CQK_NUM_THREADS");
}

// A large tensor comes from the heap, not from mmap, and its memory stays in
// the process after it is freed (glibc's default unmaps it on free).
TEST(Runtime, KeepFreedMemoryServesLargeTensorsFromTheHeapAndKeepsThem) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer replaces glibc's malloc; mallopt does not apply";
#endif
  ASSERT_TRUE(cqk::keep_freed_memory());
  const auto before = mallinfo2();
  struct mallinfo2 during {};
  {
    auto large = at::ones({16 << 20});  // 64 MiB, far above glibc's default mmap threshold
    during = mallinfo2();
    EXPECT_EQ(during.hblkhd, before.hblkhd) << "the tensor was mmap'd";
  }
  const auto after = mallinfo2();
  EXPECT_GE(after.arena, during.arena) << "freed memory went back to the system";
  // Most of it is free for the next allocation (bookkeeping may take a few KiB).
  EXPECT_GE(after.fordblks, during.fordblks + (60u << 20));
}

// The PyPI wheel's CPU matmul runs on MKL; a reference BLAS would be ~40x slower.
TEST(Runtime, CpuMatmulUsesAnOptimisedBlas) {
  const auto info = cqk::build_info();
  EXPECT_TRUE(info.blas == "mkl" || info.blas == "open" || info.blas == "openblas") << info.blas;
}

// The CPU kernels' copy matches the CPU's flags as the kernel lists them.
TEST(BuildInfo, NamesTheCpuKernelsTheCpuRuns) {
  if (std::getenv("CQK_CPU_KERNEL") != nullptr) GTEST_SKIP() << "CQK_CPU_KERNEL chooses the copy";
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line) && line.rfind("flags", 0) != 0) {
  }
  if (line.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo";
  std::istringstream words(line);
  const std::set<std::string> flags{std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
  const auto has = [&](const char* flag) { return flags.count(flag) > 0; };
  const bool avx2 = has("avx2") && has("fma");
  const bool avx512 = avx2 && has("avx512f") && has("avx512dq") && has("avx512vl");
  const auto info = cqk::build_info();
  EXPECT_EQ(info.cpu_kernels, avx512 ? "avx512" : avx2 ? "avx2" : "none");
  EXPECT_NE(cqk::describe(info).find("cpu kernels: " + info.cpu_kernels + "\n"), std::string::npos);
}

TEST(BuildInfo, ReportsVersions) {
  const auto info = cqk::build_info();
  EXPECT_EQ(info.cqk_version.substr(0, 2), "0.");
  EXPECT_EQ(info.torch_version.substr(0, 2), "2.");
  EXPECT_NE(cqk::describe(info).find("cpu threads"), std::string::npos);
#ifdef CQK_WITH_CUDA
  // The GPU check's first stage (scripts/gpu_bundle/run.sh) reads these without a device too.
  EXPECT_FALSE(info.kernel_architectures.empty());
  EXPECT_FALSE(info.cuda_runtime.empty());
  EXPECT_FALSE(info.cudnn.empty());
  EXPECT_EQ(info.gpus.size(), static_cast<size_t>(info.gpus_visible));
#endif
}

}  // namespace

#ifdef CQK_WITH_CUDA
namespace {
// Torch and cqk's kernels must share one CUDA runtime: two copies of libcudart
// in a process break stream and context sharing.
TEST(Runtime, OneCudaRuntimeIsLoaded) {
  const auto cudarts = cqk::testing::mapped_files("libcudart.so");
  EXPECT_EQ(cudarts.size(), 1u) << "libcudart copies mapped: " << cudarts.size();
}
}  // namespace
#endif

#include <filesystem>
#include <fstream>

namespace {
// libtorch carries its own std::filesystem whose remove_all crashes with
// Debian's libstdc++; cqk's link options make the system copy win.
TEST(Runtime, FilesystemRemoveAllWorksNextToLibtorch) {
  namespace fs = std::filesystem;
  const auto root = fs::temp_directory_path() / ("cqk-remove-all-" + std::to_string(::getpid()));
  fs::create_directories(root / "a" / "b");
  std::ofstream(root / "a" / "b" / "file") << "x";
  (void)at::ones({2}).sum();  // make sure libtorch is loaded and used
  EXPECT_EQ(fs::remove_all(root), 4u);
  EXPECT_FALSE(fs::exists(root));
}
}  // namespace
