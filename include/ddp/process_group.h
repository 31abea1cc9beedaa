// ddp::ProcessGroup and ddp::initProcessGroup(): who am I, who else is there, and the collectives
// between us (torch.distributed.init_process_group's twin, over the env contract ddp-launch,
// torchrun, srun and mpirun set).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/collectives.h"
#include "ddp/error.h"

namespace ddp {

/// Where a rank stands once the ranks have met and before their process group exists: what
/// InitOptions::beforeGroup sees. Valid only during that call.
class GroupStart {
 public:
  int rank() const;
  int size() const;            // WORLD_SIZE
  int localRank() const;       // LOCAL_RANK
  int localSize() const;       // LOCAL_WORLD_SIZE
  c10::Device device() const;  // the rank's device, already chosen and current
  std::chrono::milliseconds timeout() const;

  struct Impl;
  explicit GroupStart(const Impl& impl) : impl_(&impl) {}
  const Impl& impl() const { return *impl_; }

 private:
  const Impl* impl_;
};

struct InitOptions {
  Backend backend = Backend::kAuto;  // kAuto: NCCL on GPUs, shm on one host's CPUs, else Gloo; kGloo | kNccl | kShm
  std::string device = "auto";   // auto (cuda:LOCAL_RANK when GPUs are visible, else cpu) | cpu | cuda | cuda:N
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // rendezvous and every collective
  /// Runs on every rank after the ranks have met at the store and before the process group is
  /// created (for a group of one: before initProcessGroup returns). The place for what must hold
  /// before training starts and for data that one rank per host loads (ddp::loadOncePerHost): a
  /// missing data set then ends every rank with its one line before any group exists. What it
  /// throws leaves initProcessGroup.
  std::function<void(const GroupStart&)> beforeGroup;
  /// LOCAL_RANK from the legacy `--local_rank=N` argument (torch.distributed.launch without
  /// --use_env), when the program was given one; else LOCAL_RANK from the environment.
  std::optional<int> legacyLocalRank;
  /// How start-up messages name `timeout` (e.g. your program's own option).
  std::string timeoutName = "ddp::InitOptions::timeout";
  /// Under ddp-launch: the folder where the launcher writes hang_report.json when a collective times
  /// out or ranks' collectives do not pair ("" = the report goes to the launcher's log only).
  std::string hangReportDir;
  /// Compare each collective's operation, size and dtype with rank 0's before it runs, and stop with
  /// one line naming both calls when they differ (a collective on some ranks only, a different
  /// model on one rank) instead of a hang. Costs three store round trips per collective: for
  /// debugging, as TORCH_DISTRIBUTED_DEBUG=DETAIL.
  bool checkCollectives = false;
};

/// A collective in flight (c10d's Work and Future in one). wait() returns once this rank's result
/// is in place and throws what the blocking collective would (CommError, TimeoutError); a second
/// wait() returns at once. A Work destroyed unwaited still lets its collective finish (the peers run
/// it too): its tensor is never freed under it.
class Work {
 public:
  Work();  // already done
  ~Work();
  Work(Work&&) noexcept;
  Work& operator=(Work&&) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  void wait();
  /// `first`, then `next` on the thread that waits (Future.then's twin): e.g. decompress a bucket
  /// once its all-reduce is in, or start the next collective of a chain.
  static Work then(Work first, std::function<void()> next);

  struct Impl;
  explicit Work(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

/// A handle on the job's process group (copies share it). Made by initProcessGroup().
class ProcessGroup {
 public:
  int rank() const;
  int size() const;            // WORLD_SIZE
  int localRank() const;       // LOCAL_RANK: indexes this host's GPUs
  int localSize() const;       // LOCAL_WORLD_SIZE
  c10::Device device() const;  // where this rank computes (already the current CUDA device)
  Backend backend() const;     // kGloo, kNccl, kShm, or kLocal for a group of one (backendName() spells it)
  /// Where collectives take their tensors: the rank's GPU for NCCL, the CPU otherwise.
  c10::Device collectiveDevice() const;

  // The collectives (torch.distributed's), each with typed per-call options (ddp/collectives.h)
  // and an async form that returns at once with a Work (async_op=True): the tensors it reads and
  // writes (outputs included) must stay alive and untouched until wait(). Every rank calls the same
  // collectives in the same order; they complete in the order they started. Any device: a tensor
  // that is not on collectiveDevice() is moved there and back.

  /// In place, every rank ends with the reduction over ranks (sum unless `options` says otherwise:
  /// `allReduce(t, ddp::ReduceOp::kMax)`). kAvg needs a floating-point tensor.
  void allReduce(at::Tensor& tensor, const AllReduceOptions& options = {});
  Work allReduceAsync(at::Tensor& tensor, const AllReduceOptions& options = {});
  /// all_gather: element r is rank r's `input` (same shape and dtype on every rank).
  std::vector<at::Tensor> allGather(const at::Tensor& input, const CollectiveOptions& options = {});
  /// Resizes `outputs` to size() tensors now and fills them by wait().
  Work allGatherAsync(std::vector<at::Tensor>& outputs, const at::Tensor& input, const CollectiveOptions& options = {});
  /// reduce_scatter: `inputs` holds size() tensors of one shape; the result is the reduction (sum
  /// unless `options` says otherwise) over ranks of their inputs[rank()].
  at::Tensor reduceScatter(const std::vector<at::Tensor>& inputs, const ReduceScatterOptions& options = {});
  /// Sets `output` by wait().
  Work reduceScatterAsync(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                          const ReduceScatterOptions& options = {});
  /// all_to_all: inputs[r] goes to rank r; element r of the result came from rank r (size() tensors
  /// of one shape, the same on every rank).
  std::vector<at::Tensor> allToAll(const std::vector<at::Tensor>& inputs, const CollectiveOptions& options = {});
  Work allToAllAsync(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                     const CollectiveOptions& options = {});
  /// Point to point (gloo and nccl; shm refuses with one line). recv fills `tensor` in place; a
  /// peer that never sends is a TimeoutError after the group's timeout.
  void send(const at::Tensor& tensor, int dst, const CollectiveOptions& options = {});
  Work sendAsync(const at::Tensor& tensor, int dst, const CollectiveOptions& options = {});
  void recv(at::Tensor& tensor, int src, const CollectiveOptions& options = {});
  Work recvAsync(at::Tensor& tensor, int src, const CollectiveOptions& options = {});
  /// In place, every rank ends with the root's values (`broadcast(t, root)`).
  void broadcast(at::Tensor& tensor, const BroadcastOptions& options = {});
  Work broadcastAsync(at::Tensor& tensor, const BroadcastOptions& options = {});
  /// Several tensors (of any dtypes and devices) in one collective.
  void broadcast(const std::vector<at::Tensor>& tensors, const BroadcastOptions& options = {});
  /// Returns once every rank has entered (on GPUs: once this rank's queued collectives have run).
  void barrier(const CollectiveOptions& options = {});
  Work barrierAsync(const CollectiveOptions& options = {});
  /// new_group: a group of `ranks` (this group's numbering) with the same backend and timeout,
  /// numbered 0.. in ascending order of `ranks`. Every rank of this group calls it, in the same
  /// order (as new_group); a rank not in `ranks` gets nullopt.
  std::optional<ProcessGroup> newGroup(const std::vector<int>& ranks);
  /// Blocks until every collective this rank started has finished on its device. NCCL collectives
  /// return once queued (the compute stream waits for them, the host does not), so read a result
  /// of GPU collectives on the host (item(), a copy to the CPU) after this call: a peer that never
  /// joined is then a TimeoutError naming it, within the group's timeout, where a plain read would
  /// wait until NCCL's watchdog aborts the process. Gloo and shm collectives finish inside their
  /// call: nothing to wait for. Not a collective (no other rank takes part).
  void waitForCollectives();

  /// Clean shutdown: a barrier (rank 0 hosts the store, so it must leave last), then the group is
  /// closed. Collective; idempotent. The destructor of the last handle closes without the barrier.
  /// End every program with it: a rank that returns from main while another still evaluates or
  /// saves alone would be taken for a crashed rank (ddp-launch's --early_exit_grace_s).
  /// It checks that every rank reached it after the same number of collectives: a rank whose other
  /// collective (an extra step, a saveModel(..., group) or an evaluation through the DDP wrapper on
  /// some ranks only) met this barrier gets a CommError naming both ranks' collectives instead of
  /// a rank that returns while another is left behind. Afterwards every collective of the group,
  /// the DDP wrappers and checkpointers made from it included, throws ConfigError (naming where
  /// destroy() was called).
  void destroy(const char* file = __builtin_FILE(), int line = __builtin_LINE());
  bool destroyed() const;

  /// A handle on the same group whose collectives are named `label` in the hang report, the flight
  /// recorder and comm.check_collectives' lines ("all_reduce #812 (validation loss)") unless a call
  /// names its own (CollectiveOptions::label). The library names its own this way ("DDP
  /// gradients", "saveModel", ...).
  ProcessGroup withLabel(std::string label) const;
  /// The label of this handle's collectives ("" for none).
  const std::string& label() const { return label_; }

  struct Impl;
  /// Internal: handles come from initProcessGroup() (a null `impl` throws ConfigError).
  explicit ProcessGroup(std::shared_ptr<Impl> impl);
  Impl& impl() const;

 private:
  template <typename Options>
  Options labelled(const Options& options) const;

  std::shared_ptr<Impl> impl_;
  std::string label_;
};

/// Reads the env contract (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
/// MASTER_PORT from ddp-launch or torchrun; else SLURM_* or OMPI_COMM_WORLD_*), picks and sets the
/// device, meets the other ranks at the job's authenticated store and builds the process group.
/// Without any of it (a program run on its own) it is a group of one. Call it once per process.
/// SIGPIPE left at its default is ignored from here on, as Python ignores it: a peer that dies
/// mid-send then fails the collective with a line naming it instead of killing this rank.
/// Throws ConfigError for bad env or options (or a second call), CommError / TimeoutError when the
/// other ranks cannot be reached.
ProcessGroup initProcessGroup(const InitOptions& options = {});

/// This process's rank in the group initProcessGroup() made (torch.distributed.get_rank()), for
/// print guards in code that has no group at hand: `if (ddp::rank() == 0) std::printf(...)`. Keeps
/// answering after destroy(). Before initProcessGroup(): ConfigError (a guard that would let every
/// rank print is a bug to see, not to hide).
int rank();
/// The number of ranks of that group (get_world_size()); ConfigError before initProcessGroup().
int worldSize();
/// Whether initProcessGroup() has made the group (torch.distributed.is_initialized()).
bool isInitialized();

}  // namespace ddp
