#include "libddp/fsdp/unit.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/accumulate.h>
#include <torch/version.h>

#include "common/error.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace ddp {

namespace fsdp {
void setStorageBytes(const at::Tensor& tensor, size_t nbytes) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == nbytes) return;
  const c10::Device device = storage->device();
  c10::DeviceGuard guard(device);
  storage->set_data_ptr_noswap(nbytes == 0 ? at::DataPtr(nullptr, device) : storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

std::shared_ptr<BufferPool> BufferPool::shared() {
  static std::mutex mutex;
  static std::weak_ptr<BufferPool> current;
  std::lock_guard<std::mutex> lock(mutex);
  std::shared_ptr<BufferPool> pool = current.lock();
  if (!pool) {
    pool = std::make_shared<BufferPool>();
    current = pool;
  }
  return pool;
}

void BufferPool::setStorageBytes(const at::Tensor& tensor, size_t nbytes) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == nbytes) return;
  if (storage->device().type() != c10::kCPU) return fsdp::setStorageBytes(tensor, nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (storage->nbytes() > 0) {
    const size_t old = storage->nbytes();
    at::DataPtr bytes = storage->set_data_ptr(at::DataPtr(nullptr, storage->device()));
    storage->set_nbytes(0);
    if (bytes.get() != nullptr) kept_.emplace_back(old, std::move(bytes));
    if (kept_.size() > kKept) kept_.pop_front();  // frees the oldest
  }
  if (nbytes == 0) return;
  // The most recently kept buffer of this size, else new bytes.
  auto it = std::find_if(kept_.rbegin(), kept_.rend(), [&](const auto& k) { return k.first == nbytes; });
  if (it == kept_.rend()) {
    storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  } else {
    storage->set_data_ptr_noswap(std::move(it->second));
    kept_.erase(std::next(it).base());
  }
  storage->set_nbytes(nbytes);
}

at::Tensor BufferPool::empty(at::IntArrayRef sizes, const at::TensorOptions& options) {
  if (options.device().type() != c10::kCPU) return at::empty(sizes, options);
  at::Tensor out = at::empty({0}, options);
  setStorageBytes(out, static_cast<size_t>(c10::multiply_integers(sizes)) * out.element_size());
  return out.set_(out.storage(), 0, sizes);
}

void BufferPool::drain() {
  std::deque<std::pair<size_t, at::DataPtr>> freed;
  std::lock_guard<std::mutex> lock(mutex_);
  freed.swap(kept_);
}
}  // namespace fsdp

namespace {
CollectiveOptions labelled(const char* what, const torch::nn::Module& module) {
  CollectiveOptions options;
  options.label = std::string("fullyShard ") + what + " (" + module.name() + ")";
  return options;
}
}  // namespace

FullyShardedUnit::Impl::Impl(torch::nn::Module& m, ProcessGroup g, FullyShardOptions o, std::vector<std::string> n,
                             std::vector<at::Tensor> p, int64_t unitId)
    : module(&m), group(std::move(g)), options(o), names(std::move(n)), params(std::move(p)), id(unitId) {
  c10::NoGradGuard noGrad;
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& param : params) shapes.push_back(param.sizes().vec());
  layout = fsdp::ShardLayout(shapes, group.size(), group.rank());
  const at::TensorOptions bufferOptions =
      params.empty() ? at::TensorOptions().dtype(at::kFloat) : params.front().options().requires_grad(false);
  shardDtype = bufferOptions.dtype().toScalarType();
  computeDtype = options.paramDtype.value_or(shardDtype);
  reduceDtype = options.reduceDtype.value_or(shardDtype);
  shardsInFull = options.replicateParameters && computeDtype == shardDtype;
  fullFlat = at::empty({layout.fullNumel()}, bufferOptions.dtype(computeDtype));
  if (!shardsInFull) shardFlat = at::zeros({layout.shardNumel()}, bufferOptions);  // padding stays zero, as FSDP2's
  for (size_t i = 0; i < params.size(); ++i) {
    shardViews.push_back(shardsInFull ? layout.shardViewInFull(fullFlat, i) : layout.shardView(shardFlat, i));
    fullViews.push_back(layout.fullView(fullFlat, i));
    setShard(params[i].detach(), i);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].mutable_grad() = at::Tensor();
    params[i].set_data(shardViews[i]);
  }
  if (!shardsInFull) fsdp::setStorageBytes(fullFlat, 0);
}

at::Tensor FullyShardedUnit::Impl::packedShards() const {
  if (!shardsInFull) return shardFlat;
  const at::Tensor packed = at::zeros({layout.shardNumel()}, shardOptions());
  for (size_t i = 0; i < params.size(); ++i) {
    const fsdp::ParamLayout& p = layout[i];
    if (p.localRows > 0) packed.narrow(0, p.offset, p.localRows * p.rowNumel).copy_(shardViews[i].reshape({-1}));
  }
  return packed;
}

void FullyShardedUnit::Impl::setShard(const at::Tensor& full, size_t i) {
  const fsdp::ParamLayout& p = layout[i];
  if (p.localRows == 0 || p.rowNumel == 0) return;
  shardViews[i].copy_(full.reshape(p.fullShape).narrow(0, group.rank() * p.chunkRows, p.localRows));
}

FullyShardedUnit::Impl::~Impl() = default;

void FullyShardedUnit::Impl::unshard() {
  startUnshard();
  finishUnshard();
}

// Module::to() (or set_data) after sharding gives a parameter new data: the unit would gather the
// old shards and the optimizer would step the new tensor, silently apart (or LibTorch fails deep in
// a kernel). One line instead, before the all-gather.
void FullyShardedUnit::Impl::checkShardsInPlace() const {
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    const at::Tensor& s = shardViews[i];
    if (p.data_ptr() == s.data_ptr() && p.scalar_type() == s.scalar_type() && p.device() == s.device() &&
        p.sizes() == s.sizes()) {
      continue;
    }
    DDP_THROW(ConfigError, "ddp::fullyShard: parameter '", names[i], "' of ", module->name(), " is no longer its shard (",
              s.scalar_type(), " on ", s.device(), ", now ", p.scalar_type(), " on ", p.device(),
              "): Module::to() or set_data() after sharding replaces the shards; move and cast the module before "
              "ddp::fullyShard");
  }
}

void FullyShardedUnit::Impl::startUnshard() {
  if (unsharded || gathering) return;
  checkShardsInPlace();
  pool->setStorageBytes(fullFlat, static_cast<size_t>(layout.fullNumel()) * fullFlat.element_size());
  gathering = std::make_unique<Work>();
  if (layout.shardNumel() == 0) return;
  c10::NoGradGuard noGrad;
  // LibTorch 1.13's Gloo has no bf16 all-gather ("Invalid scalar type"): there the shards are
  // gathered in their own dtype and copyOut casts them (a cast per element commutes with a gather:
  // the same values, twice the bytes on the wire).
  const bool castAfterGather = TORCH_VERSION_MAJOR < 2 && group.backend() == Backend::kGloo;
  const at::Tensor shards = packedShards();
  gatherInput = computeDtype == shardDtype || castAfterGather ? shards : shards.to(computeDtype);
  *gathering = group.allGatherAsync(gathered, gatherInput, labelled("all_gather", *module));
}

void FullyShardedUnit::Impl::finishUnshard() {
  if (!gathering) return;
  c10::NoGradGuard noGrad;
  std::unique_ptr<Work> work = std::move(gathering);
  work->wait();
  if (layout.shardNumel() > 0) layout.copyOut(gathered, fullFlat);
  gathered.clear();
  gatherInput = at::Tensor();
  for (size_t i = 0; i < params.size(); ++i) params[i].set_data(fullViews[i]);
  unsharded = true;
}

void FullyShardedUnit::Impl::reshard() {
  finishUnshard();  // a prefetch nobody used: its collective still completes on every rank
  if (!unsharded) return;
  for (size_t i = 0; i < params.size(); ++i) params[i].set_data(shardViews[i]);
  if (!options.replicateParameters) pool->setStorageBytes(fullFlat, 0);
  unsharded = false;
}

void FullyShardedUnit::Impl::preBackward() {
  // Again after kPostBackward when the unit ran forward twice: FSDP2 gathers and reduces per use.
  if (backward == Backward::kPreBackward) return;
  unshard();
  if (!holdingAside) setAside.assign(params.size(), at::Tensor());
  for (size_t i = 0; i < params.size(); ++i) {
    if (!holdingAside) setAside[i] = params[i].grad();
    params[i].mutable_grad() = at::Tensor();
  }
  holdingAside = false;
  backward = Backward::kPreBackward;
}

void FullyShardedUnit::Impl::postBackward() {
  if (backward == Backward::kPostBackward) return;
  if (backward == Backward::kIdle) {  // no gradient reached its outputs: nothing to reduce
    if (holdingAside) {  // the sharded gradients held over backwards without sync come back
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = setAside[i];
      setAside.clear();
      holdingAside = false;
    }
    reshard();
    backward = Backward::kPostBackward;
    return;
  }
  c10::NoGradGuard noGrad;
  accumulated.resize(params.size());
  if (!requiresGradientSync) {
    // FSDP2's set_requires_gradient_sync(False): the full gradients accumulate here, unreduced;
    // the sharded ones stay as they were.
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor full = params[i].grad().defined() ? params[i].grad().to(reduceDtype) : at::Tensor();
      if (full.defined()) {
        if (accumulated[i].defined()) {
          accumulated[i].add_(full);
        } else {
          accumulated[i] = full;
        }
      }
      params[i].mutable_grad() = options.replicateParameters ? at::Tensor() : setAside[i];
    }
    backward = Backward::kPostBackward;
    if (options.replicateParameters) {
      // FSDP2's set_reshard_after_backward(False): the next micro-batch's forward needs no
      // all-gather; the sharded gradients wait in setAside (the parameters are whole meanwhile).
      holdingAside = true;
      return;
    }
    setAside.clear();
    reshard();
    return;
  }
  std::vector<bool> hasGrad(params.size(), false);
  bool any = false;
  for (size_t i = 0; i < params.size(); ++i) {
    if (accumulated[i].defined()) {  // micro-batches without sync before this one
      if (params[i].grad().defined()) accumulated[i].add_(params[i].grad().to(reduceDtype));
      params[i].mutable_grad() = accumulated[i];
      accumulated[i] = at::Tensor();
    }
    hasGrad[i] = params[i].grad().defined();
    any = any || hasGrad[i];
  }
  // Resharded before the reduce-scatter (the full gradients are tensors of their own): its input
  // then takes the bytes the full buffer gave back to the pool.
  reshard();
  if (any && layout.shardNumel() > 0) {
    // FSDP2's foreach_reduce: each rank's padded chunks side by side, one reduce-scatter (avg).
    const at::Tensor input = pool->empty({group.size(), layout.shardNumel()}, shardOptions().dtype(reduceDtype));
    for (size_t i = 0; i < params.size(); ++i) {
      layout.packGradient(params[i].grad(), input, i);
      params[i].mutable_grad() = at::Tensor();  // frees the full gradient
    }
    ReduceScatterOptions average(ReduceOp::kAvg);
    average.label = labelled("reduce_scatter", *module).label;
    // The rows are views of `input` (no per-rank copies); its bytes go back to the pool once the
    // reduce-scatter is done (the output has bytes of its own).
    const at::Tensor output = group.reduceScatter(input.unbind(0), average);
    pool->setStorageBytes(input, 0);
    for (size_t i = 0; i < params.size(); ++i) {
      if (!hasGrad[i]) continue;
      // A plain tensor on the output's bytes, not an autograd view: optimizers detach_() gradients.
      at::Tensor shard = layout.shardOfOutput(output, i).detach().to(shardDtype);
      if (setAside[i].defined()) {
        setAside[i].add_(shard);  // accumulates into the sharded gradient, as FSDP2
      } else {
        setAside[i] = shard;
      }
    }
  }
  for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = setAside[i];
  setAside.clear();
  backward = Backward::kPostBackward;
}

}  // namespace ddp
