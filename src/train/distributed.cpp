#include "cqk/distributed.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/cuda.h>
#include <torch/nn/module.h>

#include <cmath>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "cqk/log.h"

#if defined(CQK_WITH_CUDA) && defined(USE_C10D_NCCL) && __has_include(<nccl.h>)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define CQK_HAVE_NCCL 1
#endif

#ifndef USE_C10D_GLOO
#error "cqk's distributed training needs a LibTorch built with Gloo (USE_C10D_GLOO)"
#endif

// ProcessGroupGloo, declared here instead of through its header: the PyPI
// wheel ships torch/csrc/distributed/c10d/ProcessGroupGloo.hpp but not the gloo
// headers it includes, so it cannot be compiled against. This declares only
// what cqk calls, with the exported signatures of torch 2.11
// (ProcessGroupGloo.hpp). Options is the header's layout exactly (cqk fills its
// `devices`); the group object itself is opaque here: constructed and
// destroyed by libtorch's own code, used only through c10d::Backend, and
// sized generously (the real object holds a few pointers, containers, a mutex
// and two condition variables, well under 1 KiB). The context checks the
// constructed group's name, rank and size before using it.
namespace gloo::transport {
class Device;
}
namespace c10d {
class TORCH_API ProcessGroupGloo : public Backend {
 public:
  struct TORCH_API Options : public Backend::Options {
    explicit Options(std::chrono::milliseconds timeout = kBackendDefaultTimeout);
    static c10::intrusive_ptr<Options> create_default(std::chrono::milliseconds timeout = kBackendDefaultTimeout);
    std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
    int threads{2};
  };
  static std::shared_ptr<::gloo::transport::Device> createDeviceForHostname(const std::string& hostname,
                                                                            bool lazyInit = false);
  explicit ProcessGroupGloo(const c10::intrusive_ptr<Store>& store, int rank, int size,
                            c10::intrusive_ptr<Options> options);
  ~ProcessGroupGloo() override;

 private:
  alignas(64) unsigned char opaque_members_[4096];
};
}  // namespace c10d

namespace cqk {

namespace {

constexpr int64_t kDefaultBucketBytes = 25LL << 20;

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// The message of any exception c10d throws, on one line, without torch's backtrace.
std::string describe(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e))
    return first_line(c10_error->what_without_backtrace());
  return first_line(e.what());
}

std::string seconds_text(std::chrono::milliseconds timeout) {
  std::ostringstream out;
  out << static_cast<double>(timeout.count()) / 1000.0 << " s";
  return out.str();
}

std::optional<std::string> process_env(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

int parse_int(const std::string& name, const std::string& value, int minimum) {
  size_t used = 0;
  long parsed = 0;
  try {
    parsed = std::stol(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || used == 0 || parsed < minimum || parsed > 1 << 30)
    throw std::invalid_argument(name + ": expected an integer >= " + std::to_string(minimum) + ", got '" + value + "'");
  return static_cast<int>(parsed);
}

double parse_seconds(const std::string& name, const std::string& value) {
  size_t used = 0;
  double parsed = 0;
  try {
    parsed = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || used == 0 || !(parsed > 0) || !std::isfinite(parsed))
    throw std::invalid_argument(name + ": expected a positive number of seconds, got '" + value + "'");
  return parsed;
}

// Tensors that cannot share a flat bucket.
bool slots_differ(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() != b.scalar_type() || a.device() != b.device();
}

bool is_loopback(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1"; }

class DistributedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace

DistributedEnvironment distributed_environment() { return distributed_environment(process_env); }

DistributedEnvironment distributed_environment(const EnvLookup& lookup) {
  DistributedEnvironment env;
  if (const auto timeout = lookup("CQK_DIST_TIMEOUT"))
    env.timeout_seconds = parse_seconds("CQK_DIST_TIMEOUT", *timeout);
  if (const auto off = lookup("CQK_DIST"); off && *off == "0") return env;

  const auto rank = lookup("RANK"), world = lookup("WORLD_SIZE");
  const auto slurm_rank = lookup("SLURM_PROCID");
  auto slurm_world = lookup("SLURM_STEP_NUM_TASKS");
  if (!slurm_world) slurm_world = lookup("SLURM_NTASKS");
  if (rank || world) {
    if (!rank || !world) throw std::invalid_argument("RANK and WORLD_SIZE must be set together");
    env.source = "torchrun";
    env.world_size = parse_int("WORLD_SIZE", *world, 1);
    env.rank = parse_int("RANK", *rank, 0);
    if (const auto local = lookup("LOCAL_RANK")) {
      env.local_rank = parse_int("LOCAL_RANK", *local, 0);
    } else if (const auto local_world = lookup("LOCAL_WORLD_SIZE")) {
      env.local_rank = env.rank % parse_int("LOCAL_WORLD_SIZE", *local_world, 1);
    } else {
      env.local_rank = env.rank;
    }
  } else if (slurm_rank && slurm_world) {
    env.source = "slurm";
    env.world_size = parse_int("SLURM_NTASKS", *slurm_world, 1);
    env.rank = parse_int("SLURM_PROCID", *slurm_rank, 0);
    const auto local = lookup("SLURM_LOCALID");
    env.local_rank = local ? parse_int("SLURM_LOCALID", *local, 0) : 0;
  } else {
    return env;
  }
  if (env.rank >= env.world_size)
    throw std::invalid_argument("rank " + std::to_string(env.rank) + " is outside the world size " +
                                std::to_string(env.world_size) + " (" + env.source + " environment)");
  if (!env.distributed()) return env;
  if (const auto addr = lookup("MASTER_ADDR")) {
    env.master_addr = *addr;
  } else if (env.source == "slurm") {
    throw std::invalid_argument(
        "MASTER_ADDR is not set: under srun export the first node's host name, e.g. "
        "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)");
  }
  if (const auto port = lookup("MASTER_PORT")) env.master_port = parse_int("MASTER_PORT", *port, 1);
  if (env.master_port > 65535) throw std::invalid_argument("MASTER_PORT: expected a port <= 65535");
  if (const auto agent = lookup("TORCHELASTIC_USE_AGENT_STORE"); agent && *agent == "True") {
    // As torch.distributed does under torchrun: the agent's store, one prefix per restart.
    env.agent_store = true;
    const auto restart = lookup("TORCHELASTIC_RESTART_COUNT");
    env.store_prefix =
        "/worker/attempt_" + std::to_string(restart ? parse_int("TORCHELASTIC_RESTART_COUNT", *restart, 0) : 0);
  }
  return env;
}

c10::Device rank_device(const c10::Device& device, const DistributedEnvironment& env) {
  if (!device.is_cuda() || !env.distributed()) return device;
  const auto count = static_cast<int>(torch::cuda::device_count());
  if (count <= 0) return device;
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank % count));
}

// ---------------------------------------------------------------------------

struct DistributedContext::Impl {
  int rank = 0;
  int world = 1;
  c10::Device device{c10::kCPU};
  std::chrono::milliseconds timeout{300000};
  std::string backend_name = "none";
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;

  // One failed collective, as a one-line error naming the operation and the rank.
  [[noreturn]] void fail(const std::string& operation, const std::exception& e) const {
    throw DistributedError("distributed " + operation + " failed on rank " + std::to_string(rank) + " of " +
                           std::to_string(world) + " (" + backend_name + ", timeout " + seconds_text(timeout) + "): " +
                           describe(e) + ". Another rank probably exited or stopped responding; see its output");
  }
  template <class F>
  auto guarded(const std::string& operation, F&& body) -> decltype(body()) {
    try {
      return body();
    } catch (const DistributedError&) {
      throw;
    } catch (const std::exception& e) {
      fail(operation, e);
    }
  }

  std::vector<double> all_reduce(const std::vector<double>& values, c10d::ReduceOp op, const std::string& what) {
    return guarded(what, [&] {
      auto tensor = at::tensor(at::ArrayRef<double>(values), at::TensorOptions().dtype(at::kDouble)).to(device);
      std::vector<at::Tensor> tensors{tensor};
      c10d::AllreduceOptions options;
      options.reduceOp = op;
      backend->allreduce(tensors, options)->wait();
      const auto host = tensors[0].to(at::kCPU).contiguous();
      return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
    });
  }

  // --- gradient buckets ---
  struct Bucket {
    std::vector<size_t> members;   // indices into slots
    std::vector<int64_t> offsets;  // of each member in `flat`
    int64_t numel = 0;
    at::Tensor flat;
    size_t pending = 0;
    bool launched = false;
    c10::intrusive_ptr<c10d::Work> work;
  };
  struct Slot {
    at::Tensor parameter;
    size_t bucket = 0;
    bool ready = false;
  };
  std::mutex sync_mutex;
  std::vector<Slot> slots;
  std::vector<Bucket> buckets;
  size_t next_bucket = 0;
  bool syncing = false;
  struct {
    int64_t buckets = 0;
    int64_t launched_in_backward = 0;  // bucket all-reduces started by the hooks, all steps
    int64_t launched_after = 0;        // started by finish_gradient_sync
  } stats;  // for the log line at the end

  void mark_ready(size_t index) {
    std::lock_guard<std::mutex> lock(sync_mutex);
    if (!syncing) return;
    auto& slot = slots[index];
    if (slot.ready) return;
    slot.ready = true;
    if (--buckets[slot.bucket].pending == 0) launch_in_order(true);
  }

  // Launches the ready buckets in index order, so every rank starts the same
  // all-reduces in the same order whatever order its gradients arrived in.
  void launch_in_order(bool in_backward) {
    while (next_bucket < buckets.size() && buckets[next_bucket].pending == 0) {
      launch(buckets[next_bucket++]);
      ++(in_backward ? stats.launched_in_backward : stats.launched_after);
    }
  }

  // Runs after AccumulateGrad has written a parameter's .grad in a backward pass.
  struct GradientReadyHook final : torch::autograd::PostAccumulateGradHook {
    GradientReadyHook(Impl* impl, size_t index) : impl_(impl), index_(index) {}
    void operator()(const torch::autograd::Variable& /*parameter*/) override { impl_->mark_ready(index_); }

   private:
    Impl* impl_;
    size_t index_;
  };

  void launch(Bucket& bucket) {
    guarded("gradient all-reduce", [&] {
      at::NoGradGuard no_grad;
      if (!bucket.flat.defined()) bucket.flat = at::empty({bucket.numel}, slots[bucket.members[0]].parameter.options());
      for (size_t i = 0; i < bucket.members.size(); ++i) {
        const auto& parameter = slots[bucket.members[i]].parameter;
        auto slice = bucket.flat.narrow(0, bucket.offsets[i], parameter.numel());
        const auto& grad = parameter.grad();
        if (grad.defined()) {
          slice.copy_(grad.reshape({-1}));
        } else {
          slice.zero_();  // no gradient on this rank: it contributes zeros
        }
      }
      bucket.flat.div_(static_cast<double>(world));
      std::vector<at::Tensor> tensors{bucket.flat};
      bucket.work = backend->allreduce(tensors, c10d::AllreduceOptions{});
      bucket.launched = true;
    });
  }
};

DistributedContext::DistributedContext(const DistributedEnvironment& env, const c10::Device& device)
    : impl_(std::make_unique<Impl>()) {
  auto& s = *impl_;
  s.rank = env.rank;
  s.world = env.world_size;
  s.device = device;
  s.timeout = std::chrono::milliseconds(static_cast<int64_t>(env.timeout_seconds * 1000.0));
  if (!env.distributed()) return;
  if (device.is_cuda()) c10::impl::getDeviceGuardImpl(c10::kCUDA)->setDevice(device);

  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(env.master_port);
    options.isServer = env.rank == 0 && !env.agent_store;
    if (!env.agent_store) options.numWorkers = static_cast<size_t>(env.world_size);
    options.waitWorkers = !env.agent_store;
    options.timeout = s.timeout;
    s.store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    if (env.agent_store) s.store = c10::make_intrusive<c10d::PrefixStore>(env.store_prefix, s.store);
  } catch (const std::exception& e) {
    const std::string role =
        env.rank == 0 && !env.agent_store
            ? "rank 0 could not serve the rendezvous store on port " + std::to_string(env.master_port) +
                  " or not all " + std::to_string(env.world_size) + " ranks joined within " + seconds_text(s.timeout)
            : "rank " + std::to_string(env.rank) + " could not reach the rendezvous store at " + where + " within " +
                  seconds_text(s.timeout) + " (is rank 0 running? MASTER_ADDR/MASTER_PORT)";
    throw DistributedError("distributed rendezvous failed: " + role + ": " + describe(e));
  }

  try {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("cqk/pg", s.store);
#ifdef CQK_HAVE_NCCL
    if (device.is_cuda()) {
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = s.timeout;
      s.backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, env.rank, env.world_size, options);
      s.backend_name = "nccl";
    }
#endif
    if (!s.backend) {
      if (device.is_cuda())
        log::warn("distributed: this build has no NCCL header; using Gloo for CUDA tensors (slower)");
      c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> options;
      if (is_loopback(env.master_addr)) {
        // Single node: every rank talks over loopback only.
        options = c10::make_intrusive<c10d::ProcessGroupGloo::Options>(s.timeout);
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      } else {
        // This host's address (or GLOO_SOCKET_IFNAME's interfaces).
        options = c10d::ProcessGroupGloo::Options::create_default(s.timeout);
      }
      options->timeout = s.timeout;
      s.backend = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, env.rank, env.world_size, options);
      s.backend_name = "gloo";
      if (s.backend->getBackendName() != "gloo" || s.backend->getRank() != env.rank ||
          s.backend->getSize() != env.world_size)
        throw std::logic_error("the Gloo process group does not match this build's declaration of it");
    }
  } catch (const std::exception& e) {
    throw DistributedError("distributed: creating the process group failed on rank " + std::to_string(env.rank) +
                           " of " + std::to_string(env.world_size) + " (store " + where + ", timeout " +
                           seconds_text(s.timeout) + "): " + describe(e));
  }
  if (env.rank == 0)
    log::info("distributed: " + std::to_string(env.world_size) + " ranks (" + env.source + " environment), " +
              s.backend_name + " on " + device.str() + ", store " + where + ", timeout " + seconds_text(s.timeout));
}

DistributedContext::~DistributedContext() {
  auto& s = *impl_;
  for (auto& slot : s.slots) torch::autograd::impl::set_post_acc_grad_hooks(slot.parameter, nullptr);
  const auto launched = s.stats.launched_in_backward + s.stats.launched_after;
  if (s.rank == 0 && launched > 0 && std::uncaught_exceptions() == 0)
    log::info("distributed: " + std::to_string(s.stats.buckets) + " gradient buckets; " +
              std::to_string(s.stats.launched_in_backward) + " of " + std::to_string(launched) +
              " bucket all-reduces started during the backward pass");
  if (s.backend) {
    try {
      if (std::uncaught_exceptions() > 0) {
        s.backend->abort();
      } else {
        s.backend->shutdown();
      }
    } catch (const std::exception&) {
      // Leaving anyway.
    }
  }
  s.backend.reset();
  s.store.reset();
}

bool DistributedContext::enabled() const { return impl_->world > 1; }
int DistributedContext::rank() const { return impl_->rank; }
int DistributedContext::world_size() const { return impl_->world; }
std::string DistributedContext::backend() const { return impl_->backend_name; }
std::chrono::milliseconds DistributedContext::timeout() const { return impl_->timeout; }

void DistributedContext::check_same_run(const std::string& identity) {
  if (!enabled()) return;
  auto& s = *impl_;
  const auto bytes = [](const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); };
  const auto text = [](const std::vector<uint8_t>& data) { return std::string(data.begin(), data.end()); };
  const std::string verdict_key = "cqk/run_identity/verdict";
  std::string verdict;
  s.guarded("run check", [&] {
    s.store->set("cqk/run_identity/" + std::to_string(s.rank), bytes(identity));
    if (s.rank == 0) {
      for (int r = 1; r < s.world && verdict.empty(); ++r) {
        const auto other = text(s.store->get("cqk/run_identity/" + std::to_string(r)));
        if (other != identity)
          verdict = "rank " + std::to_string(r) + " has " + other + ", rank 0 has " + identity +
                    ": start every rank with the same config file, overrides, data and options";
      }
      s.store->set(verdict_key, bytes(verdict.empty() ? "ok" : verdict));
    } else {
      verdict = text(s.store->get(verdict_key));
      if (verdict == "ok") verdict.clear();
    }
  });
  if (!verdict.empty()) throw DistributedError("distributed: the ranks disagree on the run: " + verdict);
}

void DistributedContext::broadcast_parameters(torch::nn::Module& module) {
  if (!enabled()) return;
  auto& s = *impl_;
  s.guarded("parameter broadcast", [&] {
    at::NoGradGuard no_grad;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    const auto send = [&](const at::Tensor& tensor) {
      std::vector<at::Tensor> tensors{tensor.detach()};
      c10d::BroadcastOptions options;
      options.rootRank = 0;
      works.push_back(s.backend->broadcast(tensors, options));
    };
    for (const auto& parameter : module.parameters()) send(parameter);
    for (const auto& buffer : module.buffers()) send(buffer);
    for (auto& work : works) work->wait();
  });
}

std::vector<double> DistributedContext::all_reduce_sum(const std::vector<double>& values) {
  if (!enabled() || values.empty()) return values;
  return impl_->all_reduce(values, c10d::ReduceOp::SUM, "all-reduce");
}

void DistributedContext::barrier() {
  if (!enabled()) return;
  impl_->all_reduce({0.0}, c10d::ReduceOp::SUM, "barrier");
}

void DistributedContext::check_parameters_in_sync(const torch::nn::Module& module) {
  if (!enabled()) return;
  double sum = 0, squares = 0;
  {
    at::NoGradGuard no_grad;
    for (const auto& parameter : module.parameters()) {
      const auto p = parameter.detach().to(at::kDouble);
      sum += p.sum().item<double>();
      squares += p.square().sum().item<double>();
    }
  }
  const auto max = impl_->all_reduce({sum, squares, -sum, -squares}, c10d::ReduceOp::MAX, "parameter check");
  const auto differs = [](double hi, double lo) { return hi - lo > 1e-9 * std::max(std::abs(hi), std::abs(lo)); };
  if (differs(max[0], -max[2]) || differs(max[1], -max[3]))
    throw DistributedError("distributed: the ranks' parameters differ after training (sum ranges over [" +
                           std::to_string(-max[2]) + ", " + std::to_string(max[0]) +
                           "]); gradients were not synchronised");
}

void DistributedContext::attach_gradient_sync(const std::vector<at::Tensor>& parameters, int64_t bucket_bytes) {
  if (!enabled()) return;
  auto& s = *impl_;
  if (!s.slots.empty()) throw std::logic_error("attach_gradient_sync: already attached");
  if (bucket_bytes <= 0) {
    bucket_bytes = kDefaultBucketBytes;
    if (const auto mb = process_env("CQK_DIST_BUCKET_MB"))
      bucket_bytes = std::max<int64_t>(1, static_cast<int64_t>(parse_seconds("CQK_DIST_BUCKET_MB", *mb) * (1 << 20)));
  }
  for (const auto& parameter : parameters)
    if (parameter.requires_grad()) s.slots.push_back({parameter, 0, false});
  // Reverse order: the last layers' gradients are ready first.
  int64_t bytes = 0;
  for (size_t k = s.slots.size(); k-- > 0;) {
    const auto& parameter = s.slots[k].parameter;
    const bool fresh = s.buckets.empty() || bytes >= bucket_bytes ||
                       slots_differ(s.slots[s.buckets.back().members.front()].parameter, parameter);
    if (fresh) {
      s.buckets.emplace_back();
      bytes = 0;
    }
    auto& bucket = s.buckets.back();
    bucket.members.push_back(k);
    bucket.offsets.push_back(bucket.numel);
    bucket.numel += parameter.numel();
    bytes += parameter.numel() * static_cast<int64_t>(parameter.element_size());
    s.slots[k].bucket = s.buckets.size() - 1;
  }
  for (size_t k = 0; k < s.slots.size(); ++k)
    torch::autograd::impl::set_post_acc_grad_hooks(s.slots[k].parameter,
                                                   std::make_unique<Impl::GradientReadyHook>(impl_.get(), k));
  s.stats.buckets = static_cast<int64_t>(s.buckets.size());
}

void DistributedContext::begin_backward(bool synchronize) {
  if (!enabled()) return;
  auto& s = *impl_;
  std::lock_guard<std::mutex> lock(s.sync_mutex);
  s.syncing = synchronize && !s.buckets.empty();
  if (!s.syncing) return;
  for (auto& slot : s.slots) slot.ready = false;
  for (auto& bucket : s.buckets) {
    bucket.pending = bucket.members.size();
    bucket.launched = false;
    bucket.work.reset();
  }
  s.next_bucket = 0;
}

void DistributedContext::finish_gradient_sync() {
  if (!enabled()) return;
  auto& s = *impl_;
  std::lock_guard<std::mutex> lock(s.sync_mutex);
  if (!s.syncing) return;
  s.syncing = false;
  // Buckets with a parameter that got no gradient in this backward pass.
  for (size_t b = s.next_bucket; b < s.buckets.size(); ++b) s.buckets[b].pending = 0;
  s.launch_in_order(false);
  s.guarded("gradient all-reduce", [&] {
    at::NoGradGuard no_grad;
    for (auto& bucket : s.buckets) {
      bucket.work->wait();
      bucket.work.reset();
      for (size_t i = 0; i < bucket.members.size(); ++i) {
        auto& parameter = s.slots[bucket.members[i]].parameter;
        const auto averaged = bucket.flat.narrow(0, bucket.offsets[i], parameter.numel()).view(parameter.sizes());
        if (parameter.grad().defined()) {
          parameter.mutable_grad().copy_(averaged);
        } else {
          parameter.mutable_grad() = averaged.clone();
        }
      }
    }
  });
}

}  // namespace cqk
