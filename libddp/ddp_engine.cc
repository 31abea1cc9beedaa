// ddp::DdpEngine, DistributedDataParallel's engine, over the gradient sync of libddp/engine/.
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>
#include <torch/nn/module.h>

#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "ddp/ddp.h"
#include "libddp/engine/engine_state.h"
#include "libddp/fsdp/sharded_parameter.h"
#include "libddp/internal.h"

namespace ddp {
namespace {

size_t megabytes(double mb, const char* name) {
  if (!(mb > 0)) DDP_THROW(ConfigError, "ddp::DdpOptions::", name, " must be positive (got ", mb, ")");
  return static_cast<size_t>(mb * (1 << 20));
}

// One tensor's description for comparing replicas: dim, up to kDims sizes (the rest folded into
// the last), dtype, requires_grad.
constexpr int64_t kDims = 6;
constexpr int64_t kRecord = kDims + 3;

void describeInto(const at::Tensor& t, int64_t* out) {
  out[0] = t.dim();
  for (int64_t d = 0; d < kDims; ++d) out[1 + d] = d < t.dim() ? t.size(d) : -1;
  for (int64_t d = kDims; d < t.dim(); ++d) out[kDims] *= t.size(d);
  out[kDims + 1] = static_cast<int64_t>(t.scalar_type());
  out[kDims + 2] = t.requires_grad() ? 1 : 0;
}

std::string describeRecord(const int64_t* r) {
  std::string shape = "[";
  for (int64_t d = 0; d < std::min(r[0], kDims); ++d) shape.append(d ? ", " : "").append(std::to_string(r[1 + d]));
  shape.append(r[0] > kDims ? ", ...]" : "]");
  shape.append(" ").append(c10::toString(static_cast<c10::ScalarType>(r[kDims + 1])));
  if (r[kDims + 2] != 0) shape.append(" requiring grad");
  return shape;
}

// DDP's _verify_param_shape_across_processes: every rank must wrap the same model (the number,
// shapes, dtypes and requires_grad of its parameters, then its buffers' number and shapes), or the
// construction broadcast would pair tensors of different sizes (Gloo aborts the process) and the
// gradient buckets would not line up. Two small all-gathers; a difference is the same ConfigError
// on every rank, naming the first one.
void verifyReplicasMatch(ProcessGroup& group, const std::vector<std::string>& names,
                         const std::vector<at::Tensor>& tensors, size_t parameters) {
  const auto options = at::TensorOptions(at::kLong).device(group.collectiveDevice());
  at::Tensor counts = at::tensor({static_cast<int64_t>(parameters), static_cast<int64_t>(tensors.size() - parameters)},
                                 at::TensorOptions(at::kLong)).to(options.device());
  std::vector<at::Tensor> allCounts = group.allGather(counts);
  auto countOf = [&](int r) { return allCounts[static_cast<size_t>(r)].cpu(); };
  const at::Tensor zeroCounts = countOf(0);
  for (int r = 1; r < group.size(); ++r) {
    const at::Tensor other = countOf(r);
    if (!at::equal(other, zeroCounts)) {
      DDP_THROW(ConfigError, "ddp::DistributedDataParallel: the ranks wrap different models: rank 0's has ",
                zeroCounts[0].item<int64_t>(), " parameters and ", zeroCounts[1].item<int64_t>(), " buffers, rank ", r,
                "'s ", other[0].item<int64_t>(), " and ", other[1].item<int64_t>(),
                "; every rank must build the same model before wrapping it");
    }
  }
  at::Tensor mine = at::empty({static_cast<int64_t>(tensors.size()), kRecord}, at::TensorOptions(at::kLong));
  for (size_t i = 0; i < tensors.size(); ++i) describeInto(tensors[i], mine[static_cast<int64_t>(i)].data_ptr<int64_t>());
  if (tensors.empty()) return;
  std::vector<at::Tensor> all = group.allGather(mine.to(options.device()));
  const at::Tensor zero = all[0].cpu().contiguous();
  for (int r = 1; r < group.size(); ++r) {
    const at::Tensor other = all[static_cast<size_t>(r)].cpu().contiguous();
    if (at::equal(other, zero)) continue;
    const at::Tensor differs = (other != zero).any(1).nonzero();
    const int64_t i = differs[0][0].item<int64_t>();
    const bool buffer = static_cast<size_t>(i) >= parameters;
    DDP_THROW(ConfigError, "ddp::DistributedDataParallel: the ranks wrap different models: ", buffer ? "buffer" : "parameter",
              " '", names[static_cast<size_t>(i)], "' (", buffer ? "buffers[" : "parameters[",
              buffer ? i - static_cast<int64_t>(parameters) : i, "] in this rank's model) is ",
              describeRecord(zero[i].data_ptr<int64_t>()), " on rank 0 but ", describeRecord(other[i].data_ptr<int64_t>()),
              " on rank ", r, "; every rank must build the same model before wrapping it");
  }
}

}  // namespace

void DdpEngine::registerCommHook(std::shared_ptr<CommHook> hook) {
  if (!hook) DDP_THROW(ConfigError, "ddp::DistributedDataParallel::registerCommHook: the hook is null");
  internal::checkLive(state_->group, "registerCommHook");
  if (state_->flat) {
    DDP_THROW(ConfigError, "ddp::DistributedDataParallel::registerCommHook: hooks reduce the buckets of the bucketed "
              "reducer; ddp::DdpOptions::reducer is flat");
  }
  if (!state_->reducer) return;  // a group of one: nothing to reduce
  state_->reducer->setHook(std::move(hook));
}

DdpEngine::DdpEngine(torch::nn::Module& module, ProcessGroup group, DdpOptions options)
    : state_(std::make_unique<State>(std::move(group))) {
  internal::checkLive(state_->group, "DistributedDataParallel's construction");
  ProcessGroup construction = state_->group.withLabel("DistributedDataParallel construction");
  engine::ReducerOptions reducer;
  reducer.bucketCapBytes = megabytes(options.bucketCapMb, "bucketCapMb");
  reducer.firstBucketCapBytes = megabytes(options.firstBucketCapMb, "firstBucketCapMb");
  reducer.findUnusedParameters = options.findUnusedParameters;
  reducer.gradientAsBucketView = options.gradientAsBucketView;
  reducer.compression = options.compression == GradientCompression::kFp16   ? engine::WireDtype::kFp16
                        : options.compression == GradientCompression::kBf16 ? engine::WireDtype::kBf16
                                                                           : engine::WireDtype::kNone;
  reducer.staticGraph = options.staticGraph;
  state_->flat = options.reducer == GradientReducer::kFlat;

  std::vector<at::Tensor> every;   // what rank 0 gives the replicas: frozen parameters too
  std::vector<at::Tensor> params;  // what the gradient sync reduces: those that require grad, as PyTorch's
  std::vector<std::string> names;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (fsdp::shardOfParameter(item.value())) {
      DDP_THROW(ConfigError, "ddp::DistributedDataParallel: '", item.key(), "' is a shard of a ddp::fullyShard unit; "
                "fully sharded units reduce-scatter their own gradients and each rank holds other rows, so rank 0's "
                "would overwrite the others': train the sharded model without the DDP wrapper");
    }
    every.push_back(item.value());
    if (!item.value().requires_grad()) continue;
    names.push_back(item.key());
    params.push_back(item.value());
  }
  if (params.empty()) {
    DDP_THROW(ConfigError, "ddp::DistributedDataParallel: the module has no parameters",
              every.empty() ? "" : " that require grad (all " + std::to_string(every.size()) + " are frozen)",
              ", so there is nothing to train; register them with register_parameter / register_module");
  }
  state_->buffers = module.buffers(/*recurse=*/true);
  state_->params = params;
  state_->broadcastBuffers = options.broadcastBuffers;
  // Replicas start equal: rank 0's parameters (frozen ones too) and buffers everywhere (DDP's
  // constructor, _sync_module_states).
  std::vector<at::Tensor> all = every;
  all.insert(all.end(), state_->buffers.begin(), state_->buffers.end());
  if (state_->group.size() > 1) {
    std::vector<std::string> allNames;
    for (const auto& item : module.named_parameters(/*recurse=*/true)) allNames.push_back(item.key());
    for (const auto& item : module.named_buffers(/*recurse=*/true)) allNames.push_back(item.key());
    verifyReplicasMatch(construction, allNames, all, every.size());
  }
  construction.broadcast(all, /*root=*/0);
  const int size = state_->group.size();
  state_->syncBuffers = size > 1 && options.broadcastBuffers && !state_->buffers.empty();
  if (size == 1 && !options.syncOnOneRank) return;
  ProcessGroup gradients = state_->group.withLabel("DDP gradients");  // the reducer's collectives, named in reports
  if (options.reducer == GradientReducer::kBucketed) {
    auto bucketed = std::make_unique<engine::Reducer>(gradients, params, names, reducer);
    state_->reducer = bucketed.get();
    state_->gradientSync = std::move(bucketed);
    if (options.commHook) registerCommHook(options.commHook);
  } else {
    if (options.commHook) {
      DDP_THROW(ConfigError, "ddp::DdpOptions::commHook reduces the buckets of the bucketed reducer; "
                "ddp::DdpOptions::reducer is flat");
    }
    state_->gradientSync = std::make_unique<engine::FlatGradientSync>(gradients, params);
  }
}

DdpEngine::~DdpEngine() = default;

ProcessGroup& DdpEngine::group() { return state_->group; }

void DdpEngine::zeroGrad() {
  if (state_->reducer) {
    state_->reducer->zeroGrad();
    return;
  }
  c10::NoGradGuard noGrad;
  for (const at::Tensor& p : state_->params) {
    at::Tensor grad = p.grad();
    if (grad.defined()) grad.zero_();
  }
}

void DdpEngine::beforeForward() {
  internal::checkLive(state_->group, "a forward through the DDP wrapper");
  if (state_->join && state_->gradientSync) {
    // DDP._pre_forward under Join: this rank still trains (the joined ranks count zeros), the
    // buffers come from the highest rank still training, and whether the backward will sync.
    ProcessGroup group = state_->group.withLabel("Join: still training");
    const double training = State::sumOver(group, 1);
    if (state_->join->throwOnEarlyTermination && State::sumOver(group, 0) > 0) {
      DDP_THROW(Error, "ddp::Join: a rank ran out of inputs; every rank stops here "
                "(ddp::JoinOptions::throwOnEarlyTermination)");
    }
    if (state_->requireForwardParamSync && state_->syncBuffers) {
      const int root = State::commonRank(group, true);
      at::AutoDispatchBelowADInplaceOrView belowAutograd;  // as below: the buffers' versions stay
      group.broadcast(state_->buffers, root);
    }
    State::sumOver(group, sync_ ? 1 : 0);
    if (!state_->join->divideByInitialWorldSize && state_->reducer) state_->reducer->setNextDivisor(training);
    return;
  }
  if (state_->requireForwardParamSync && state_->syncBuffers) {
    // As DDP's _sync_buffers, whose c10d copies run below autograd: the buffers' versions stay, so an
    // earlier forward whose backward is still to come (two forwards, then one backward over both
    // losses; an evaluation forward between a forward and its backward) keeps a valid graph — its
    // saved running statistics are not used by a training-mode BatchNorm's backward.
    at::AutoDispatchBelowADInplaceOrView belowAutograd;
    state_->bufferBroadcast.broadcast(state_->buffers, /*root=*/0);
  }
}

void DdpEngine::afterForward(const std::vector<at::Tensor>& outputs) {
  // Only a forward that backward will follow arms the gradient sync (torch.is_grad_enabled()).
  state_->requireForwardParamSync = sync_ && c10::GradMode::is_enabled();
  if (state_->gradientSync && state_->requireForwardParamSync) state_->gradientSync->prepareForBackward(outputs);
}

void DdpEngine::backwardWithoutBatch() {
  internal::checkLive(state_->group, "backwardWithoutBatch()");
  if (state_->join) {
    DDP_THROW(ConfigError, "ddp::DistributedDataParallel::backwardWithoutBatch inside a ddp::Join: there a rank that "
              "has no batch leaves its loop and the Join answers for it; call one or the other");
  }
  // Rank 0 without a batch while another has one: the others' forwards update their buffers, and
  // the next forward replaces them with rank 0's, which did not. Rank 0 alone knows it (a check
  // over the group would be a collective in every forward), and the gradients are right: a warning.
  if (state_->syncBuffers && state_->group.rank() == 0 && !state_->warnedRankZeroWithoutBatch) {
    state_->warnedRankZeroWithoutBatch = true;
    spdlog::warn("ddp::DistributedDataParallel::backwardWithoutBatch on rank 0: every forward takes the buffers (e.g. "
                 "BatchNorm's running statistics) from rank 0, so what this step's forwards on the other ranks add to "
                 "theirs is lost at the next one; give rank 0 a batch whenever another rank has one (a "
                 "ddp::DistributedSampler's shards do), or set ddp::DdpOptions::broadcastBuffers = false");
  }
  // The forward's side: rank 0's buffers, as beforeForward() broadcasts them.
  if (state_->requireForwardParamSync && state_->syncBuffers) {
    state_->bufferBroadcast.broadcast(state_->buffers, /*root=*/0);
  }
  state_->requireForwardParamSync = sync_;
  if (!sync_ || !state_->gradientSync) return;  // under noSync a zero gradient accumulates nothing
  state_->gradientSync->reduceWithoutBackward();
}

DdpEngine::NoSync::NoSync(DdpEngine& engine) : engine_(engine), previous_(engine.sync_) { engine_.sync_ = false; }
DdpEngine::NoSync::~NoSync() { engine_.sync_ = previous_; }

}  // namespace ddp
