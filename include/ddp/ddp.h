// ddp-launch's C++ library: DistributedDataParallel for your own LibTorch training loop.
//
//   ddp::ProcessGroup group = ddp::initProcessGroup();     // env contract → rendezvous → Gloo/NCCL
//   Net net;  net->to(group.device());
//   ddp::DistributedDataParallel<Net> model(net, group);  // rank 0's weights everywhere
//   ddp::DistributedSampler sampler(dataset_size, group);
//   for (epoch ...) { sampler.setEpoch(epoch); for (batch of sampler.batches(64)) {
//       optimizer.zero_grad(); loss(model.forward(x), y).backward(); optimizer.step(); } }
//   ddp::saveModel(*net, "model.pt", group);               // rank 0 writes; plain keys, CPU, torch.load
//   group.destroy();                                      // every rank leaves together
//
// Start the program with `ddp-launch --nproc_per_node=N ./program` (or torchrun, srun, mpirun).
// Every class here is safe to use with world size 1 (a program run on its own).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/error.h"
#include "ddp/version.h"

namespace ddp {

// ---------------------------------------------------------------------------------------------
// Process group: who am I, who else is there, and the collectives between us.

struct InitOptions {
  std::string backend = "auto";  // auto (NCCL on GPUs, shm on one host's CPUs, else Gloo) | gloo | nccl | shm
  std::string device = "auto";   // auto (cuda:LOCAL_RANK when GPUs are visible, else cpu) | cpu | cuda | cuda:N
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // rendezvous and every collective
};

/// A handle on the job's process group (copies share it). Made by initProcessGroup().
class ProcessGroup {
 public:
  int rank() const;
  int size() const;            // WORLD_SIZE
  int localRank() const;       // LOCAL_RANK: indexes this host's GPUs
  int localSize() const;       // LOCAL_WORLD_SIZE
  c10::Device device() const;  // where this rank computes (already the current CUDA device)
  std::string backend() const; // "gloo", "nccl", or "local" for world size 1
  /// Where collectives take their tensors: the rank's GPU for NCCL, the CPU otherwise.
  c10::Device collectiveDevice() const;

  /// In place, every rank ends with the sum (or the mean) over ranks. Any device: the tensor is
  /// moved to collectiveDevice() and back when it lives elsewhere.
  void allReduceSum(at::Tensor& tensor);
  void allReduceMean(at::Tensor& tensor);
  /// In place, every rank ends with `root`'s values.
  void broadcast(at::Tensor& tensor, int root = 0);
  void broadcast(const std::vector<at::Tensor>& tensors, int root = 0);
  void barrier();

  /// Clean shutdown: a barrier (rank 0 hosts the store, so it must leave last), then the group is
  /// closed. Collective; idempotent. The destructor of the last handle closes without the barrier.
  void destroy();
  bool destroyed() const;

  struct Impl;
  explicit ProcessGroup(std::shared_ptr<Impl> impl);
  Impl& impl() const;

 private:
  std::shared_ptr<Impl> impl_;
};

/// Reads the env contract (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
/// MASTER_PORT from ddp-launch or torchrun; else SLURM_* or OMPI_COMM_WORLD_*), picks and sets the
/// device, meets the other ranks at the job's authenticated store and builds the process group.
/// Without any of it (a program run on its own) it is a group of one. Call it once per process.
/// Throws ConfigError for bad env or options (or a second call), CommError / TimeoutError when the
/// other ranks cannot be reached.
ProcessGroup initProcessGroup(const InitOptions& options = {});

// ---------------------------------------------------------------------------------------------
// DistributedDataParallel: gradients averaged over ranks during backward.

struct DdpOptions {
  double bucketCapMb = 25;            // like DDP's bucket_cap_mb
  double firstBucketCapMb = 1;        // a small first bucket starts communication early
  bool findUnusedParameters = false;  // parameters the forward did not reach count as ready
  bool broadcastBuffers = true;       // rank 0's buffers (BatchNorm statistics) before each forward
  bool gradientAsBucketView = false;  // .grad aliases the communication bucket (saves a copy)
  std::string compression = "none";   // none | fp16 | bf16: the dtype gradients travel in (DDP's
                                      // fp16_compress_hook / bf16_compress_hook)
};

/// The engine behind DistributedDataParallel, for any torch::nn::Module. Construction broadcasts
/// rank 0's parameters and buffers (collective). Per forward: beforeForward(), the module's forward,
/// afterForward(outputs); the next backward from those outputs leaves every .grad averaged over
/// ranks (bucketed all-reduces overlapped with backward, PyTorch DDP's Reducer).
class DdpEngine {
 public:
  DdpEngine(torch::nn::Module& module, ProcessGroup group, DdpOptions options = {});
  ~DdpEngine();
  DdpEngine(const DdpEngine&) = delete;
  DdpEngine& operator=(const DdpEngine&) = delete;

  void beforeForward();
  void afterForward(const std::vector<at::Tensor>& outputs);

  /// While a NoSync lives, backwards only accumulate locally (DDP's no_sync()): the first backward
  /// after it ends communicates the sum of all of them.
  class NoSync {
   public:
    explicit NoSync(DdpEngine& engine);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DdpEngine& engine_;
    bool previous_;
  };
  bool syncEnabled() const { return sync_; }
  ProcessGroup& group();

 private:
  struct State;
  std::unique_ptr<State> state_;
  bool sync_ = true;
};

namespace detail {
inline void collectTensors(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }
inline void collectTensors(const std::vector<at::Tensor>& ts, std::vector<at::Tensor>& out) {
  out.insert(out.end(), ts.begin(), ts.end());
}
template <typename... T>
void collectTensors(const std::tuple<T...>& ts, std::vector<at::Tensor>& out) {
  std::apply([&out](const auto&... t) { (collectTensors(t, out), ...); }, ts);
}
template <typename A, typename B>
void collectTensors(const std::pair<A, B>& p, std::vector<at::Tensor>& out) {
  collectTensors(p.first, out);
  collectTensors(p.second, out);
}
}  // namespace detail

/// Wraps a module holder (a TORCH_MODULE type, e.g. `Net`, or any ModuleHolder). forward() returns
/// what the module's forward returns: a tensor, a vector, tuple or pair of tensors.
/// module() is the plain model: save it, evaluate it, its keys have no "module." prefix.
template <typename ModuleHolder>
class DistributedDataParallel {
 public:
  DistributedDataParallel(ModuleHolder module, ProcessGroup group, DdpOptions options = {})
      : module_(std::move(module)), engine_(*module_.ptr(), std::move(group), options) {}

  template <typename... Args>
  auto forward(Args&&... args) {
    engine_.beforeForward();
    auto output = module_->forward(std::forward<Args>(args)...);
    std::vector<at::Tensor> tensors;
    detail::collectTensors(output, tensors);
    engine_.afterForward(tensors);
    return output;
  }
  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  ModuleHolder& module() { return module_; }
  const ModuleHolder& module() const { return module_; }
  DdpEngine& engine() { return engine_; }
  /// `{ auto guard = model.noSync(); ...forward, backward... }`: accumulate without communicating.
  [[nodiscard]] DdpEngine::NoSync noSync() { return DdpEngine::NoSync(engine_); }

 private:
  ModuleHolder module_;
  DdpEngine engine_;
};

// ---------------------------------------------------------------------------------------------
// DistributedSampler: each rank's share of the data set, bit-identical to PyTorch's.

struct SamplerOptions {
  bool shuffle = true;    // reshuffled every epoch from seed + epoch
  uint64_t seed = 0;      // equal on every rank
  bool dropLast = false;  // false: pad by repeating the head, so every rank has as many samples
};

class DistributedSampler {
 public:
  DistributedSampler(int64_t datasetSize, const ProcessGroup& group, SamplerOptions options = {});
  DistributedSampler(int64_t datasetSize, int numReplicas, int rank, SamplerOptions options = {});
  ~DistributedSampler();
  DistributedSampler(DistributedSampler&&) noexcept;
  DistributedSampler& operator=(DistributedSampler&&) noexcept;

  /// Call before every epoch, or every epoch sees the same order (Python's set_epoch).
  void setEpoch(int64_t epoch);
  /// This rank's indices for the current epoch (numSamples() of them).
  std::vector<int64_t> indices() const;
  /// indices() cut into batches of `batchSize` (the last one shorter unless dropLast).
  std::vector<std::vector<int64_t>> batches(int64_t batchSize, bool dropLast = false) const;
  int64_t numSamples() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------------
// Exported models and training checkpoints.

/// The module's parameters and buffers as Python's module.state_dict(): plain keys (any leading
/// "module." removed), CPU tensors, in torch.save's zip format (Python: torch.load(path), any
/// device). Written atomically. With a group: rank 0 writes and every rank returns after it.
void saveModel(const torch::nn::Module& module, const std::string& path);
void saveModel(const torch::nn::Module& module, const std::string& path, ProcessGroup& group);
/// Loads a state_dict (ours or Python's torch.save, keys with or without "module.", tensors saved
/// on any device) into `module`, converted to its devices. One CheckpointError lists every missing,
/// unexpected or misshaped key before anything changes.
void loadModel(torch::nn::Module& module, const std::string& path);

/// Where training stands; the next step is step `stepInEpoch` of `epoch`.
struct TrainPosition {
  int64_t epoch = 0;
  int64_t stepInEpoch = 0;  // optimizer steps already done in `epoch`
  int64_t globalStep = 0;   // optimizer steps done in total
  int64_t samples = 0;      // samples consumed, all ranks
};

struct CheckpointOptions {
  std::string dir = "checkpoints";
  int64_t keepLast = 3;  // older checkpoints are deleted (0: keep all)
  uint64_t seed = 0;     // recorded in the file
  std::string config;    // recorded in the file: the run's settings, as text (e.g. YAML)
  // How error messages name `dir` and `keepLast` (e.g. your own config's keys).
  std::string dirName = "CheckpointOptions::dir";
  std::string keepLastName = "CheckpointOptions::keepLast";
};

/// Training checkpoints for exact resume: model, optimizer state (SGD momentum by parameter name;
/// any other LibTorch optimizer through its own archive), position, the CPU generator and every
/// rank's GPU generator; checksummed, written atomically by rank 0 (Python's torch.load reads it).
class Checkpointer {
 public:
  Checkpointer(ProcessGroup group, CheckpointOptions options = {});
  /// Collective: every rank returns once the file is complete. Returns its path.
  std::string save(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const TrainPosition& position);
  /// Collective: loads the newest checkpoint of dir that verifies (skipping damaged ones) into the
  /// module, optimizer and generators; nullopt when there is none. Ranks that found different
  /// checkpoints get a CommError. Call after the module is on its device and the optimizer built.
  std::optional<TrainPosition> resume(torch::nn::Module& module, torch::optim::Optimizer& optimizer);
  /// resume() from one file.
  TrainPosition resumeFrom(const std::string& path, torch::nn::Module& module, torch::optim::Optimizer& optimizer);

 private:
  ProcessGroup group_;
  CheckpointOptions options_;
  int64_t lastSavedStep_ = -1;
};

}  // namespace ddp
