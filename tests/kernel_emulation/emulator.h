#pragma once
// A CPU emulator of the small part of CUDA the cqk kernels use, so that the
// kernels' own code (tiling, lane groups, shuffles, shared memory, atomics)
// runs in CI without a GPU and is compared against an ATen reference.
//
// A launch runs the grid's blocks one after another. The threads of a block
// are fibers (ucontext) on the calling thread, switched only at barriers:
// __syncthreads is a block barrier, a warp shuffle two warp barriers around an
// exchange through per-thread slots. Each warp runs as far ahead of the others
// as its barriers allow, in ascending or descending order, so a missing
// __syncthreads between warps shows as a wrong result. Dynamic shared memory
// is NaN before each block and followed by a checked NaN guard; out-of-bounds
// global accesses are for ASan (the sanitizer build). What it cannot show:
// anything about timing, lockstep inside a warp, or the rounding of device
// intrinsics.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <tuple>
#include <utility>

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace cqk::emulation {

// The order in which the threads of a block run from one barrier to the next,
// and the blocks of a grid run. A kernel must not depend on it; a missing
// barrier usually gives a different result in one of the two orders.
enum class RunOrder { kAscending, kDescending };

// What the emulated device reports to cudaDeviceGetAttribute (a few
// multiprocessors make the launchers split each head over several blocks),
// and the run order.
struct DeviceProperties {
  int multiprocessors = 4;
  int smem_optin = 232448;  // bytes per block after opting in, as on an H100/H200
  RunOrder order = RunOrder::kAscending;
};
DeviceProperties& device();

// Sets the run order for the launches in its scope.
class ScopedRunOrder {
 public:
  explicit ScopedRunOrder(RunOrder order) : saved_(device().order) { device().order = order; }
  ~ScopedRunOrder() { device().order = saved_; }
  ScopedRunOrder(const ScopedRunOrder&) = delete;
  ScopedRunOrder& operator=(const ScopedRunOrder&) = delete;

 private:
  RunOrder saved_;
};

inline const char* run_order_name(RunOrder order) {
  return order == RunOrder::kAscending ? "ascending" : "descending";
}

// Launches run so far in the process, for tests that check a launch really ran.
int64_t launch_count();

const dim3& thread_index();
const dim3& block_index();
const dim3& block_dim();
const dim3& grid_dim();
float* dynamic_shared();
void sync_block();
float shuffle_xor(unsigned mask, float value, int lane_mask);

// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes).
void set_dynamic_shared_limit(const void* kernel, int bytes);

// Runs `body` once per thread of every block of the grid; refuses what a
// launch of `kernel` would (an empty or oversized grid or block, more than
// 48 KB of dynamic shared memory without cudaFuncSetAttribute).
void run_grid(const void* kernel, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
              const std::function<void()>& body);

// kernel<<<grid, block, smem>>>(args...) as Launch(kernel, grid, block, smem)(args...).
template <class... Params>
class Launch {
 public:
  Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t dynamic_shared_bytes)
      : kernel_(kernel), grid_(grid), block_(block), smem_(dynamic_shared_bytes) {}

  template <class... Args>
  void operator()(Args&&... args) const {
    const std::tuple<Params...> params(std::forward<Args>(args)...);  // converted once, as a launch does
    run_grid(reinterpret_cast<const void*>(kernel_), grid_, block_, smem_, [&] { std::apply(kernel_, params); });
  }

 private:
  void (*kernel_)(Params...);
  dim3 grid_, block_;
  size_t smem_;
};

}  // namespace cqk::emulation
