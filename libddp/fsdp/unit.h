// The state of one fully sharded unit (FSDP2's FSDPParamGroup, torch/distributed/fsdp/_fully_shard/
// _fsdp_param_group.py): its parameters, their flat shard and full buffers, and the steps
// forward and backward take it through. The autograd glue that calls these steps is in
// libddp/fully_shard.cc.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ddp/fully_shard.h"
#include "ddp/process_group.h"
#include "libddp/fsdp/shard_layout.h"

namespace ddp {

namespace fsdp {
/// The bytes of the units' full buffers and reduce-scatter inputs between two uses, shared by the
/// units of a process (FSDP2 on GPUs gets this from CUDA's caching allocator): what one unit's
/// reshard() gives back is its reduce-scatter's input, then the next unit's full buffer, without
/// the kernel's fresh pages. CPU only (CUDA's allocator caches already, and knows streams). It
/// keeps at most kKept buffers, and none once a forward or a backward has ended (drain()): between
/// steps it holds nothing.
class BufferPool {
 public:
  // One: the next all-gather (a prefetch) takes it before any compute, so the peak stays as it
  // was; two kept another unit's bytes through the compute (+1 block in the measured peak).
  static constexpr size_t kKept = 1;

  /// The pool of this process's units: made with the first unit, freed with the last.
  static std::shared_ptr<BufferPool> shared();
  /// fsdp::setStorageBytes through the pool: the storage's old bytes are kept (the storage object
  /// keeps none: views of it cannot see them), its new ones are a kept buffer of that size if any.
  void setStorageBytes(const at::Tensor& tensor, size_t nbytes);
  /// A contiguous tensor whose bytes come from the pool; setStorageBytes(it, 0) gives them back.
  at::Tensor empty(at::IntArrayRef sizes, const at::TensorOptions& options);
  /// Frees the kept buffers.
  void drain();

 private:
  std::mutex mutex_;
  std::deque<std::pair<size_t, at::DataPtr>> kept_;  // by size in bytes, oldest first
};
}  // namespace fsdp

struct FullyShardedUnit::Impl {
  /// Shards `params` (the module's tensors, named `names`) at once: their data becomes this
  /// rank's shards, their .grad is cleared.
  Impl(torch::nn::Module& module, ProcessGroup group, FullyShardOptions options, std::vector<std::string> names,
       std::vector<at::Tensor> params, int64_t id);
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  /// All-gathers the shards into the full buffer (its bytes from `pool`) and points every parameter's
  /// data at its full view. Collective; nothing when already unsharded.
  void unshard();
  /// This rank's padded shards as one flat tensor (S elements, padding zero): shardFlat, or when
  /// the shards live in the full buffer, a packed copy of them. The all-gather's input.
  at::Tensor packedShards() const;
  /// Copies this rank's rows of `full` (parameter i's full value) into its shard.
  void setShard(const at::Tensor& full, size_t i);
  /// The shards' dtype and device.
  at::TensorOptions shardOptions() const { return fullFlat.options().dtype(shardDtype); }
  /// unshard() in two halves: start the all-gather (async), then wait for it and point the
  /// parameters at the full views. FSDP2's backward prefetch starts a unit's all-gather while the
  /// unit before it still computes.
  void startUnshard();
  void finishUnshard();
  /// ConfigError when a parameter's data is no longer its shard (Module::to() after sharding).
  void checkShardsInPlace() const;
  /// Points the parameters back at their shards and gives the full buffer's bytes to `pool` (its
  /// storage object stays: autograd's saved tensors may hold views of it until the next
  /// unshard()); under replicateParameters the bytes stay, for the next all-gather.
  void reshard();
  /// The first gradient reaching the unit's outputs (of each of its forwards, when it ran more
  /// than one): unshard, and set the sharded gradients aside so that autograd accumulates full
  /// ones.
  void preBackward();
  /// The unit's backward is done: reshard, reduce-scatter (average) the full gradients into
  /// sharded ones (added to those set aside), free the full gradients. Once per preBackward().
  /// Without gradient sync under replicateParameters: the parameters stay gathered and the
  /// sharded gradients set aside (held) until the synced backward.
  void postBackward();

  enum class Backward { kIdle, kPreBackward, kPostBackward };

  torch::nn::Module* module;
  ProcessGroup group;
  FullyShardOptions options;
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  int64_t id;
  fsdp::ShardLayout layout;
  at::Tensor shardFlat;  // this rank's padded shards (S elements): the all-gather's input; undefined
                         // when shardsInFull
  at::Tensor fullFlat;   // the padded full parameters (world × S), no bytes while sharded
  std::shared_ptr<fsdp::BufferPool> pool = fsdp::BufferPool::shared();
  // replicateParameters without a paramDtype: the shards are views of this rank's rows of the
  // full buffer, which is never freed (ZeRO-2's 4 P + 12 P / N: no copy of them beside it).
  bool shardsInFull = false;
  std::vector<at::Tensor> shardViews, fullViews;
  std::vector<at::Tensor> setAside;     // the sharded gradients during backward
  std::vector<at::Tensor> accumulated;  // full gradients of backwards without gradient sync
  bool holdingAside = false;  // setAside kept over backwards without sync (replicateParameters)
  bool requiresGradientSync = true;
  bool unsharded = false;
  at::ScalarType shardDtype = at::kFloat;    // the parameters' own: shards, sharded gradients
  at::ScalarType computeDtype = at::kFloat;  // paramDtype: the all-gather and the full parameters
  at::ScalarType reduceDtype = at::kFloat;   // the reduce-scatter's
  // Declared before `gathering`, so destroyed after it: an unwaited all-gather's Work may still
  // read its input when destroyed.
  at::Tensor gatherInput;             // the all-gather's input: the shards in computeDtype
  std::vector<at::Tensor> gathered;   // its output, one shard buffer per rank
  std::unique_ptr<Work> gathering;    // a started all-gather (startUnshard) not yet waited for
  bool rootOfForward = false;  // entered when no other unit was in its forward
  Backward backward = Backward::kIdle;
};

namespace fsdp {
/// Frees (0) or allocates `nbytes` for the storage of `tensor`, keeping the storage object, so
/// every view of it sees the new bytes (Python's tensor.untyped_storage().resize_(n), without
/// copying the old bytes). Device-agnostic: the storage's own allocator.
void setStorageBytes(const at::Tensor& tensor, size_t nbytes);
}  // namespace fsdp

}  // namespace ddp
