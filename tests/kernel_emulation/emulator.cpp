#include "emulator.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

namespace cqk::emulation {
namespace {

constexpr int kWarp = 32;
constexpr size_t kStackBytes = 256 * 1024;
// NaN floats after a block's dynamic shared memory; one that changed means a
// write past its end (a read past it returns NaN).
constexpr size_t kSharedGuardFloats = 1024;
constexpr int kDefaultDynamicSharedLimit = 48 * 1024;  // without cudaFuncSetAttribute

// AddressSanitizer follows the stack switches when told (its fiber API); the
// scheduler's own stack is learnt at the first switch into a fiber.
const void* g_scheduler_stack = nullptr;
size_t g_scheduler_stack_size = 0;
#if defined(__SANITIZE_ADDRESS__)
void before_switch(void** save, const void* to_stack, size_t to_size) {
  __sanitizer_start_switch_fiber(save, to_stack, to_size);
}
void after_switch(void* saved) { __sanitizer_finish_switch_fiber(saved, nullptr, nullptr); }
void first_entry() { __sanitizer_finish_switch_fiber(nullptr, &g_scheduler_stack, &g_scheduler_stack_size); }
#else
void before_switch(void**, const void*, size_t) {}
void after_switch(void*) {}
void first_entry() {}
#endif

// Misuse of the emulated CUDA inside a fiber: an exception cannot leave a fiber.
[[noreturn]] void fatal(const std::string& what) {
  std::fprintf(stderr, "cuda emulation: %s\n", what.c_str());
  std::abort();
}

// Fiber stacks, each above a PROT_NONE page so that an overflow faults
// instead of running into the next stack. Kept for the process.
class Stacks {
 public:
  // Room for `threads` stacks; remaps (invalidating earlier stacks) when it grows.
  void reserve(size_t threads) {
    if (threads > count_) grow(threads);
  }
  char* get(int thread) const { return base_ + thread * slot() + page(); }

 private:
  static size_t page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }
  static size_t slot() { return page() + kStackBytes; }
  void grow(size_t count) {
    void* p = mmap(nullptr, count * slot(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("cuda emulation: no memory for the fiber stacks");
    for (size_t t = 0; t < count; ++t) mprotect(static_cast<char*>(p) + t * slot(), page(), PROT_NONE);
    if (base_) munmap(base_, count_ * slot());
    base_ = static_cast<char*>(p);
    count_ = count;
  }
  char* base_ = nullptr;
  size_t count_ = 0;
};

struct Barrier {
  int arrived = 0;
  int64_t generation = 0;
};

struct Fiber {
  ucontext_t context;
  char* stack = nullptr;
  dim3 index;
  int linear = 0;
  bool done = false;
  const Barrier* waiting_on = nullptr;  // skipped by the scheduler until that barrier moves on
  int64_t waiting_generation = 0;
};

// The block being run (blocks run one at a time).
struct Block {
  dim3 grid, dim, index;
  const std::function<void()>* body = nullptr;
  std::vector<Fiber> fibers;
  Fiber* current = nullptr;
  ucontext_t scheduler;
  int live = 0;
  Barrier block_barrier;
  std::vector<Barrier> warp_barriers;
  std::vector<int> warp_live;
  std::vector<float> shuffle_slots;
  std::vector<int> shuffle_masks;
  std::vector<float> shared;  // the dynamic shared memory, then the guard
  size_t shared_floats = 0;
  bool progressed = false;
};

Block* g_block = nullptr;
int64_t g_launches = 0;
Stacks g_stacks;
std::unordered_map<const void*, int> g_dynamic_shared_limits;  // cudaFuncSetAttribute's, per kernel

Block& block() {
  if (!g_block || !g_block->current) fatal("a device function was called outside an emulated launch");
  return *g_block;
}

void yield(Block& b) {
  void* fake_stack = nullptr;
  before_switch(&fake_stack, g_scheduler_stack, g_scheduler_stack_size);
  swapcontext(&b.current->context, &b.scheduler);
  after_switch(fake_stack);
}

// Waits until all `participants` live threads of the barrier have arrived.
void wait_at(Block& b, Barrier& barrier, int participants) {
  b.progressed = true;
  if (++barrier.arrived >= participants) {
    barrier.arrived = 0;
    ++barrier.generation;
    return;
  }
  Fiber& self = *b.current;
  self.waiting_on = &barrier;
  self.waiting_generation = barrier.generation;
  while (barrier.generation == self.waiting_generation) yield(b);
  self.waiting_on = nullptr;
}

// A thread that exits no longer counts at the barriers (as on the hardware);
// the others may then be complete.
void release_if_complete(Barrier& barrier, int participants) {
  if (barrier.arrived > 0 && barrier.arrived >= participants) {
    barrier.arrived = 0;
    ++barrier.generation;
  }
}

void fiber_main() {
  first_entry();
  Block& b = *g_block;
  (*b.body)();
  Fiber& self = *b.current;
  self.done = true;
  b.progressed = true;
  --b.live;
  --b.warp_live[self.linear / kWarp];
  release_if_complete(b.block_barrier, b.live);
  release_if_complete(b.warp_barriers[self.linear / kWarp], b.warp_live[self.linear / kWarp]);
  // Leaves for good: nothing may run on this stack after the announced switch.
  before_switch(nullptr, g_scheduler_stack, g_scheduler_stack_size);
  setcontext(&b.scheduler);
}

std::string block_name(const Block& b) {
  return "block (" + std::to_string(b.index.x) + ", " + std::to_string(b.index.y) + ", " +
         std::to_string(b.index.z) + ")";
}

void run_block(Block& b) {
  const int threads = static_cast<int>(b.dim.x * b.dim.y * b.dim.z);
  const int warps = (threads + kWarp - 1) / kWarp;
  b.fibers.assign(threads, Fiber{});
  b.live = threads;
  b.block_barrier = Barrier{};
  b.warp_barriers.assign(warps, Barrier{});
  b.warp_live.assign(warps, kWarp);
  if (threads % kWarp) b.warp_live.back() = threads % kWarp;
  b.shuffle_slots.assign(threads, 0.0f);
  b.shuffle_masks.assign(threads, 0);
  std::fill(b.shared.begin(), b.shared.end(), std::numeric_limits<float>::quiet_NaN());
  g_stacks.reserve(threads);
  for (int t = 0; t < threads; ++t) {
    Fiber& f = b.fibers[t];
    f.linear = t;
    f.index = dim3(t % b.dim.x, t / b.dim.x % b.dim.y, t / (b.dim.x * b.dim.y));
    f.stack = g_stacks.get(t);
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack;
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = nullptr;  // fiber_main leaves through setcontext
    makecontext(&f.context, fiber_main, 0);
  }
  // Each warp in turn runs as far as it can (through its shuffles, up to a
  // block barrier) before the next one starts: a warp gets as far ahead of
  // the others as the barriers allow, so that a missing __syncthreads lets it
  // overwrite shared memory the others still read.
  const bool descending = device().order == RunOrder::kDescending;
  auto runnable = [](const Fiber& f) {
    return !f.done && !(f.waiting_on && f.waiting_on->generation == f.waiting_generation);
  };
  while (b.live > 0) {
    b.progressed = false;
    for (int w = 0; w < warps; ++w) {
      const int warp = descending ? warps - 1 - w : w;
      const int first = warp * kWarp, size = std::min(kWarp, threads - first);
      for (bool ran = true; ran;) {
        ran = false;
        for (int i = 0; i < size; ++i) {
          Fiber& f = b.fibers[first + (descending ? size - 1 - i : i)];
          if (!runnable(f)) continue;
          ran = true;
          b.current = &f;
          void* fake_stack = nullptr;
          before_switch(&fake_stack, f.stack, kStackBytes);
          swapcontext(&b.scheduler, &f.context);
          after_switch(fake_stack);
        }
      }
    }
    b.current = nullptr;
    if (!b.progressed)
      throw std::runtime_error("cuda emulation: " + block_name(b) + " deadlocked: " + std::to_string(b.live) +
                               " threads wait at barriers the others never reach");
  }
  for (size_t i = b.shared_floats; i < b.shared.size(); ++i)
    if (!std::isnan(b.shared[i]))
      throw std::runtime_error("cuda emulation: " + block_name(b) + " wrote past the end of its " +
                               std::to_string(b.shared_floats * sizeof(float)) +
                               " bytes of dynamic shared memory (float " + std::to_string(i) + ")");
}

}  // namespace

DeviceProperties& device() {
  static DeviceProperties properties;
  return properties;
}

int64_t launch_count() { return g_launches; }

const dim3& thread_index() { return block().current->index; }
const dim3& block_index() { return block().index; }
const dim3& block_dim() { return block().dim; }
const dim3& grid_dim() { return block().grid; }
float* dynamic_shared() { return block().shared.data(); }

void sync_block() {
  Block& b = block();
  wait_at(b, b.block_barrier, b.live);
}

float shuffle_xor(unsigned mask, float value, int lane_mask) {
  Block& b = block();
  const int t = b.current->linear, warp = t / kWarp, lane = t % kWarp;
  if (mask != 0xffffffffu) fatal("only full-warp shuffles are emulated");
  if (b.warp_live[warp] != kWarp) fatal("a shuffle in a warp with exited or missing threads");
  if (lane_mask < 0 || lane_mask >= kWarp) fatal("shuffle lane mask out of range: " + std::to_string(lane_mask));
  b.shuffle_slots[t] = value;
  b.shuffle_masks[t] = lane_mask;
  wait_at(b, b.warp_barriers[warp], kWarp);
  const int partner = warp * kWarp + (lane ^ lane_mask);
  if (b.shuffle_masks[partner] != lane_mask)
    fatal("lanes " + std::to_string(lane) + " and " + std::to_string(partner % kWarp) + " of warp " +
          std::to_string(warp) + " meet in shuffles with lane masks " + std::to_string(lane_mask) + " and " +
          std::to_string(b.shuffle_masks[partner]) + " (divergent shuffles)");
  const float value_of_partner = b.shuffle_slots[partner];
  wait_at(b, b.warp_barriers[warp], kWarp);  // nobody overwrites a slot before it is read
  return value_of_partner;
}

void set_dynamic_shared_limit(const void* kernel, int bytes) { g_dynamic_shared_limits[kernel] = bytes; }

void run_grid(const void* kernel, dim3 grid, dim3 block_dim, size_t dynamic_shared_bytes,
              const std::function<void()>& body) {
  if (g_block) throw std::logic_error("cuda emulation: a launch inside a launch");
  const unsigned threads = block_dim.x * block_dim.y * block_dim.z;
  if (threads == 0 || threads > 1024) throw std::invalid_argument("cuda emulation: a block needs 1..1024 threads");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535)
    throw std::invalid_argument("cuda emulation: invalid grid (" + std::to_string(grid.x) + ", " +
                                std::to_string(grid.y) + ", " + std::to_string(grid.z) + ")");
  const auto limit = g_dynamic_shared_limits.find(kernel);
  const int64_t allowed = limit == g_dynamic_shared_limits.end() ? kDefaultDynamicSharedLimit : limit->second;
  if (static_cast<int64_t>(dynamic_shared_bytes) > std::min<int64_t>(allowed, device().smem_optin))
    throw std::invalid_argument("cuda emulation: " + std::to_string(dynamic_shared_bytes) +
                                " bytes of dynamic shared memory, the kernel may use " + std::to_string(allowed) +
                                " (cudaFuncSetAttribute) and the device allows " +
                                std::to_string(device().smem_optin));
  Block b;
  b.grid = grid;
  b.dim = block_dim;
  b.body = &body;
  b.shared_floats = (dynamic_shared_bytes + sizeof(float) - 1) / sizeof(float);
  b.shared.resize(b.shared_floats + kSharedGuardFloats);
  ++g_launches;
  g_block = &b;
  try {
    const unsigned blocks = grid.x * grid.y * grid.z;
    for (unsigned i = 0; i < blocks; ++i) {
      const unsigned n = device().order == RunOrder::kDescending ? blocks - 1 - i : i;
      b.index = dim3(n % grid.x, n / grid.x % grid.y, n / (grid.x * grid.y));
      run_block(b);
    }
  } catch (...) {
    g_block = nullptr;
    throw;
  }
  g_block = nullptr;
}

}  // namespace cqk::emulation
