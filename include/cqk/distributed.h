#pragma once
// Data-parallel training on PyTorch's c10d engine: one process per rank, a
// TCPStore rendezvous (rank 0 serves it), then ProcessGroupGloo on CPUs or
// ProcessGroupNCCL on GPUs. The trainer uses a DistributedContext for every
// cross-rank step; with one process (no environment, or WORLD_SIZE=1) the
// context is a no-op and training is exactly single-process training.
//
// The environment is the one torchrun gives its workers (RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR, MASTER_PORT), or Slurm's srun (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID, with MASTER_ADDR/MASTER_PORT exported by the
// job script); `cqk launch` sets it for local ranks. See docs/DISTRIBUTED.md.
//
// Every collective converts c10d's errors (a timeout, a dead peer, an
// unreachable store) into a one-line std::runtime_error naming the operation
// and the rank. The timeout is $CQK_DIST_TIMEOUT seconds (default 300).
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace cqk {

// Where this process sits in a data-parallel job.
struct DistributedEnvironment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // rank on this node: picks the GPU (cuda:LOCAL_RANK)
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  double timeout_seconds = 300.0;  // rendezvous and every collective
  std::string source = "none";     // where it came from: none | torchrun | slurm
  // torchrun's agent already serves a store at MASTER_ADDR:MASTER_PORT
  // (TORCHELASTIC_USE_AGENT_STORE=True): every rank is a client, under this key prefix.
  bool agent_store = false;
  std::string store_prefix;
  bool distributed() const { return world_size > 1; }
};

// Reads the process environment (or `lookup`, for tests): RANK and WORLD_SIZE
// when set (torchrun, cqk launch), otherwise SLURM_PROCID and
// SLURM_STEP_NUM_TASKS / SLURM_NTASKS (srun), otherwise one process.
// CQK_DIST=0 forces one process. Throws std::invalid_argument naming the
// variable on a malformed value.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
DistributedEnvironment distributed_environment();
DistributedEnvironment distributed_environment(const EnvLookup& lookup);

// The device a rank trains on: cuda:(LOCAL_RANK mod visible GPUs) when
// `device` is a GPU and the job is distributed; `device` otherwise.
c10::Device rank_device(const c10::Device& device, const DistributedEnvironment& env);

class DistributedContext {
 public:
  // One process: a no-op context. Otherwise the rendezvous (TCPStore at
  // MASTER_ADDR:MASTER_PORT, served by rank 0) and the process group: NCCL
  // when `device` is a GPU (and this build has NCCL's header), Gloo otherwise.
  DistributedContext(const DistributedEnvironment& env, const c10::Device& device);
  ~DistributedContext();
  DistributedContext(const DistributedContext&) = delete;
  DistributedContext& operator=(const DistributedContext&) = delete;

  bool enabled() const;  // world size > 1
  int rank() const;
  int world_size() const;
  bool is_main() const { return rank() == 0; }
  std::string backend() const;  // none | gloo | nccl
  std::chrono::milliseconds timeout() const;

  // `identity`: what every rank of one run must share (the trainer's: config
  // hash, data fingerprint, the command's options). Throws naming the first
  // rank whose identity differs from rank 0's (on every rank).
  void check_same_run(const std::string& identity);
  // Parameters and buffers of `module` from rank 0 to all ranks.
  void broadcast_parameters(torch::nn::Module& module);
  // Element-wise sum over ranks (evaluation sums, the step's loss); unchanged with one process.
  std::vector<double> all_reduce_sum(const std::vector<double>& values);
  void barrier();
  // Throws if the parameters differ between ranks (a fingerprint compared with all-reduces).
  void check_parameters_in_sync(const torch::nn::Module& module);

  // Gradient averaging, overlapped with the backward pass: the parameters are
  // cut into buckets of about `bucket_bytes` (in reverse order, the order in
  // which gradients arrive); a post-accumulate-grad hook on each parameter
  // launches a bucket's asynchronous all-reduce as soon as all its gradients
  // are there (buckets launch in the same order on every rank).
  // $CQK_DIST_BUCKET_MB overrides the default 25 MiB.
  void attach_gradient_sync(const std::vector<at::Tensor>& parameters, int64_t bucket_bytes = 0);
  // Before each backward pass: `synchronize` only for the last micro-batch of
  // a step (the others accumulate locally, like DDP's no_sync).
  void begin_backward(bool synchronize);
  // After the last backward pass of a step: launches the buckets still
  // pending (parameters without a gradient contribute zeros), waits for all
  // and leaves every gradient averaged over the ranks.
  void finish_gradient_sync();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cqk
