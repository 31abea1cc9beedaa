// ddp::DdpEngine (DistributedDataParallel's engine) and ddp::DistributedSampler over the
// project's Reducer and sampler.
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

#include <exception>
#include <memory>
#include <optional>

#include "common/error.h"
#include "ddp/ddp.h"
#include "libddp/engine/gradient_sync.h"
#include "libddp/engine/reducer.h"
#include "libddp/internal.h"
#include "sampler/batching.h"
#include "libddp/sampler_options.h"
#include "sampler/distributed_sampler.h"

namespace ddp {

struct DdpEngine::State {
  explicit State(ProcessGroup g) : group(std::move(g)), bufferBroadcast(group.withLabel("DDP buffer broadcast")) {}
  ProcessGroup group;
  ProcessGroup bufferBroadcast;  // the group, its collectives named for reports
  std::vector<at::Tensor> buffers;
  bool syncBuffers = false;
  // PyTorch DDP's require_forward_param_sync: the last forward was one whose backward communicates
  // (or there was none yet), so the next forward starts from rank 0's buffers. Inside no_sync that
  // is the first micro-batch's forward only.
  bool requireForwardParamSync = true;
  std::unique_ptr<engine::GradientSync> gradientSync;  // none for a group of one
  engine::Reducer* reducer = nullptr;                  // gradientSync when bucketed
  bool flat = false;
  std::vector<at::Tensor> params;
  bool broadcastBuffers = true;
  // ddp::Join: set while a Join context is active and enabled.
  std::optional<JoinOptions> join;

  // The highest rank whose `mine` is true (DDP's _find_common_rank: a MAX all-reduce of the rank,
  // or -1 where `mine` is false).
  static int commonRank(ProcessGroup& group, bool mine) {
    at::Tensor rank = at::full({1}, mine ? group.rank() : -1, at::TensorOptions(at::kInt).device(group.collectiveDevice()));
    group.allReduce(rank, ReduceOp::kMax);
    const int common = rank.item<int>();
    if (common < 0) {
      DDP_THROW(CommError, "ddp::Join: no rank qualified as the source of the model (ranks disagree about who joined)");
    }
    return common;
  }
  // One element all-reduced: the sum over ranks of `value`.
  static double sumOver(ProcessGroup& group, double value) {
    at::Tensor t = at::full({1}, value, at::TensorOptions(at::kFloat).device(group.collectiveDevice()));
    group.allReduce(t);
    return t.item<double>();
  }
};

namespace {

size_t megabytes(double mb, const char* name) {
  if (!(mb > 0)) DDP_THROW(ConfigError, "ddp::DdpOptions::", name, " must be positive (got ", mb, ")");
  return static_cast<size_t>(mb * (1 << 20));
}

}  // namespace

void DdpEngine::registerCommHook(std::shared_ptr<CommHook> hook) {
  if (!hook) DDP_THROW(ConfigError, "ddp::DistributedDataParallel::registerCommHook: the hook is null");
  api::checkLive(state_->group, "registerCommHook");
  if (state_->flat) {
    DDP_THROW(ConfigError, "ddp::DistributedDataParallel::registerCommHook: hooks reduce the buckets of the bucketed "
              "reducer; ddp::DdpOptions::reducer is flat");
  }
  if (!state_->reducer) return;  // a group of one: nothing to reduce
  state_->reducer->setHook(std::move(hook));
}

DdpEngine::DdpEngine(torch::nn::Module& module, ProcessGroup group, DdpOptions options)
    : state_(std::make_unique<State>(std::move(group))) {
  api::checkLive(state_->group, "DistributedDataParallel's construction");
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

  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    names.push_back(item.key());
    params.push_back(item.value());
  }
  if (params.empty()) {
    DDP_THROW(ConfigError, "ddp::DistributedDataParallel: the module has no parameters, so there is nothing to "
              "train; register them with register_parameter / register_module");
  }
  state_->buffers = module.buffers(/*recurse=*/true);
  state_->params = params;
  state_->broadcastBuffers = options.broadcastBuffers;
  // Replicas start equal: rank 0's parameters and buffers everywhere (DDP's constructor).
  std::vector<at::Tensor> all = params;
  all.insert(all.end(), state_->buffers.begin(), state_->buffers.end());
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
  api::checkLive(state_->group, "a forward through the DDP wrapper");
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
      group.broadcast(state_->buffers, root);
    }
    State::sumOver(group, sync_ ? 1 : 0);
    if (!state_->join->divideByInitialWorldSize && state_->reducer) state_->reducer->setNextDivisor(training);
    return;
  }
  if (state_->requireForwardParamSync && state_->syncBuffers) {
    state_->bufferBroadcast.broadcast(state_->buffers, /*root=*/0);
  }
}

void DdpEngine::afterForward(const std::vector<at::Tensor>& outputs) {
  // Only a forward that backward will follow arms the gradient sync (torch.is_grad_enabled()).
  state_->requireForwardParamSync = sync_ && c10::GradMode::is_enabled();
  if (state_->gradientSync && state_->requireForwardParamSync) state_->gradientSync->prepareForBackward(outputs);
}

void DdpEngine::backwardWithoutBatch() {
  api::checkLive(state_->group, "backwardWithoutBatch()");
  if (state_->join) {
    DDP_THROW(ConfigError, "ddp::DistributedDataParallel::backwardWithoutBatch inside a ddp::Join: there a rank that "
              "has no batch leaves its loop and the Join answers for it; call one or the other");
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

// ---------------------------------------------------------------------------------------------

struct DistributedSampler::Impl {
  sampler::DistributedSampler sampler;
};

DistributedSampler::DistributedSampler(int64_t datasetSize, const ProcessGroup& group, SamplerOptions options)
    : DistributedSampler(datasetSize, group.size(), group.rank(), options) {}

DistributedSampler::DistributedSampler(int64_t datasetSize, int numReplicas, int rank, SamplerOptions options)
    : impl_(std::make_unique<Impl>(
          Impl{sampler::DistributedSampler(datasetSize, api::samplerOptions(numReplicas, rank, options))})) {}

DistributedSampler::~DistributedSampler() = default;
DistributedSampler::DistributedSampler(DistributedSampler&&) noexcept = default;
DistributedSampler& DistributedSampler::operator=(DistributedSampler&&) noexcept = default;

void DistributedSampler::setEpoch(int64_t epoch) { impl_->sampler.setEpoch(epoch); }
void DistributedSampler::setEpoch(int64_t epoch, int64_t start) { impl_->sampler.setEpoch(epoch, start); }
std::vector<int64_t> DistributedSampler::indices() const { return impl_->sampler.indices(); }
int64_t DistributedSampler::numSamples() const { return impl_->sampler.numSamples(); }
int64_t DistributedSampler::numSamplesOf(int rank) const { return impl_->sampler.numSamplesOf(rank); }

std::vector<std::vector<int64_t>> DistributedSampler::batches(int64_t batchSize, bool dropLast) const {
  if (batchSize < 1) DDP_THROW(ConfigError, "ddp::DistributedSampler::batches: batchSize must be >= 1 (got ", batchSize, ")");
  return sampler::makeBatches(indices(), batchSize, dropLast);
}

}  // namespace ddp

namespace ddp {
std::vector<std::vector<int64_t>> DistributedSampler::epochBatches(int64_t epoch, int64_t batchSize, bool dropLast) {
  setEpoch(epoch);
  return batches(batchSize, dropLast);
}
}  // namespace ddp

namespace ddp {

Join::Join(DdpEngine& engine, JoinOptions options)
    : engine_(engine), options_(options), uncaught_(std::uncaught_exceptions()) {
  DdpEngine::State& state = *engine_.state_;
  api::checkLive(state.group, "ddp::Join");
  if (state.join) DDP_THROW(ConfigError, "ddp::Join: this model is in a Join already; one Join at a time");
  if (!options_.enable) return;
  if (state.flat) {
    DDP_THROW(ConfigError, "ddp::Join shadows the buckets of the bucketed reducer; ddp::DdpOptions::reducer is flat");
  }
  state.join = options_;
}

Join::~Join() noexcept(false) {
  DdpEngine::State& state = *engine_.state_;
  if (finished_ || std::uncaught_exceptions() != uncaught_) {
    state.join.reset();
    return;
  }
  finish();
}

// Join.__exit__ with DDP's join hook: per step of the ranks still training, "how many still
// train?" then the step's collectives with zeros; at the end the last joiner's model for all.
void Join::finish() {
  DdpEngine::State& state = *engine_.state_;
  if (finished_) return;
  finished_ = true;
  state.join.reset();
  if (!options_.enable || !state.gradientSync) return;  // disabled, or a group of one
  api::checkLive(state.group, "ddp::Join");
  ProcessGroup group = state.group.withLabel("Join: joined rank");
  bool lastJoiner = true;
  while (DdpEngine::State::sumOver(group, 0) > 0) {
    if (options_.throwOnEarlyTermination) {
      DdpEngine::State::sumOver(group, 1);  // the others' check: someone ran out
      DDP_THROW(Error, "ddp::Join: rank ", group.rank(), " ran out of inputs first; every rank stops here "
                "(ddp::JoinOptions::throwOnEarlyTermination)");
    }
    if (state.requireForwardParamSync && state.syncBuffers) {
      const int root = DdpEngine::State::commonRank(group, false);
      group.broadcast(state.buffers, root);
    }
    const bool sync = DdpEngine::State::sumOver(group, 0) > 0;
    state.requireForwardParamSync = sync;
    if (sync) state.reducer->shadowBackward();
    lastJoiner = false;
  }
  const int root = DdpEngine::State::commonRank(group, lastJoiner);
  std::vector<at::Tensor> model = state.params;
  if (state.broadcastBuffers) model.insert(model.end(), state.buffers.begin(), state.buffers.end());
  c10::NoGradGuard noGrad;
  group.broadcast(model, root);
}

}  // namespace ddp
