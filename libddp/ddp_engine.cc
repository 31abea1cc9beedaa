// ddp::DdpEngine (DistributedDataParallel's engine) and ddp::DistributedSampler over the
// project's Reducer and sampler.
#include <torch/nn/module.h>

#include <memory>

#include "libddp/internal.h"
#include "comm/gradient_sync.h"
#include "comm/reducer.h"
#include "common/error.h"
#include "ddp/ddp.h"
#include "sampler/batching.h"
#include "sampler/distributed_sampler.h"

namespace ddp {

struct DdpEngine::State {
  explicit State(ProcessGroup g) : group(std::move(g)) {}
  ProcessGroup group;
  std::vector<at::Tensor> buffers;
  bool syncBuffers = false;
  // PyTorch DDP's require_forward_param_sync: the last forward was one whose backward communicates
  // (or there was none yet), so the next forward starts from rank 0's buffers. Inside no_sync that
  // is the first micro-batch's forward only.
  bool requireForwardParamSync = true;
  std::unique_ptr<api::LabelledCommunicator> gradients;  // the reducer's collectives, named in reports
  std::unique_ptr<comm::GradientSync> gradientSync;       // none for a group of one
  comm::Reducer* reducer = nullptr;                       // gradientSync when bucketed
  bool flat = false;
};

namespace {

size_t megabytes(double mb, const char* name) {
  if (!(mb > 0)) DDP_THROW(ConfigError, "ddp::DdpOptions::", name, " must be positive (got ", mb, ")");
  return static_cast<size_t>(mb * (1 << 20));
}

// A CommHook's Work as the reducer waits for it.
class WorkAsPending final : public comm::PendingWork {
 public:
  explicit WorkAsPending(Work work) : work_(std::move(work)) {}
  void wait() override { work_.wait(); }

 private:
  Work work_;
};

// The public CommHook behind the reducer's BucketHook; its collectives go through `group`, whose
// collectives are labelled "DDP gradients" in reports.
class HookAdapter final : public comm::BucketHook {
 public:
  HookAdapter(std::shared_ptr<CommHook> hook, ProcessGroup group) : hook_(std::move(hook)), group_(std::move(group)) {}
  std::unique_ptr<comm::PendingWork> run(size_t index, bool isLast, at::Tensor& buffer,
                                         const std::vector<at::Tensor>& views,
                                         const std::vector<at::Tensor>& params) override {
    GradBucket bucket(index, isLast, buffer, views, params);
    return std::make_unique<WorkAsPending>(hook_->run(bucket, group_));
  }

 private:
  std::shared_ptr<CommHook> hook_;
  ProcessGroup group_;
};

}  // namespace

void DdpEngine::registerCommHook(std::shared_ptr<CommHook> hook) {
  if (!hook) DDP_THROW(ConfigError, "ddp::DistributedDataParallel::registerCommHook: the hook is null");
  api::communicatorOf(state_->group, "registerCommHook");
  if (state_->flat) {
    DDP_THROW(ConfigError, "ddp::DistributedDataParallel::registerCommHook: hooks reduce the buckets of the bucketed "
              "reducer; ddp::DdpOptions::reducer is flat");
  }
  if (!state_->reducer) return;  // a group of one: nothing to reduce
  const std::string name = hook->name();
  ProcessGroup hookGroup = api::wrapCommunicator(*state_->gradients, state_->group.device(),
                                                 state_->group.localRank(), state_->group.localSize());
  state_->reducer->setHook(std::make_shared<HookAdapter>(std::move(hook), std::move(hookGroup)), name);
}

DdpEngine::DdpEngine(torch::nn::Module& module, ProcessGroup group, DdpOptions options)
    : state_(std::make_unique<State>(std::move(group))) {
  comm::Communicator& comm = api::communicatorOf(state_->group, "DistributedDataParallel's construction");
  api::CollectiveLabel label(state_->group, "DistributedDataParallel construction");
  if (options.reducer != "bucketed" && options.reducer != "flat") {
    DDP_THROW(ConfigError, "ddp::DdpOptions::reducer is '", options.reducer, "'; use bucketed or flat");
  }
  comm::ReducerOptions reducer;
  reducer.bucketCapBytes = megabytes(options.bucketCapMb, "bucketCapMb");
  reducer.firstBucketCapBytes = megabytes(options.firstBucketCapMb, "firstBucketCapMb");
  reducer.findUnusedParameters = options.findUnusedParameters;
  reducer.gradientAsBucketView = options.gradientAsBucketView;
  reducer.compression = comm::parseCompression(options.compression);
  reducer.staticGraph = options.staticGraph;
  state_->flat = options.reducer == "flat";

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
  // Replicas start equal: rank 0's parameters and buffers everywhere (DDP's constructor).
  std::vector<at::Tensor> all = params;
  all.insert(all.end(), state_->buffers.begin(), state_->buffers.end());
  comm::broadcastTensors(comm, all, /*root=*/0);
  state_->syncBuffers = comm.size() > 1 && options.broadcastBuffers && !state_->buffers.empty();
  if (comm.size() == 1) return;
  state_->gradients = std::make_unique<api::LabelledCommunicator>(state_->group, "DDP gradients");
  if (options.reducer == "bucketed") {
    auto bucketed = std::make_unique<comm::Reducer>(*state_->gradients, params, names, reducer);
    state_->reducer = bucketed.get();
    state_->gradientSync = std::move(bucketed);
    if (options.commHook) registerCommHook(options.commHook);
  } else {
    if (options.commHook) {
      DDP_THROW(ConfigError, "ddp::DdpOptions::commHook reduces the buckets of the bucketed reducer; "
                "ddp::DdpOptions::reducer is flat");
    }
    state_->gradientSync = std::make_unique<comm::FlatGradientSync>(*state_->gradients, params);
  }
}

DdpEngine::~DdpEngine() = default;

ProcessGroup& DdpEngine::group() { return state_->group; }

void DdpEngine::beforeForward() {
  comm::Communicator& comm = api::communicatorOf(state_->group, "a forward through the DDP wrapper");
  if (state_->requireForwardParamSync && state_->syncBuffers) {
    api::CollectiveLabel label(state_->group, "DDP buffer broadcast");
    comm::broadcastTensors(comm, state_->buffers, /*root=*/0);
  }
}

void DdpEngine::afterForward(const std::vector<at::Tensor>& outputs) {
  // Only a forward that backward will follow arms the gradient sync (torch.is_grad_enabled()).
  state_->requireForwardParamSync = sync_ && c10::GradMode::is_enabled();
  if (state_->gradientSync && state_->requireForwardParamSync) state_->gradientSync->prepareForBackward(outputs);
}

DdpEngine::NoSync::NoSync(DdpEngine& engine) : engine_(engine), previous_(engine.sync_) { engine_.sync_ = false; }
DdpEngine::NoSync::~NoSync() { engine_.sync_ = previous_; }

// ---------------------------------------------------------------------------------------------

struct DistributedSampler::Impl {
  sampler::DistributedSampler sampler;
};

namespace {

sampler::DistributedSamplerOptions samplerOptions(int numReplicas, int rank, const SamplerOptions& o) {
  sampler::DistributedSamplerOptions out;
  out.numReplicas = numReplicas;
  out.rank = rank;
  out.shuffle = o.shuffle;
  out.seed = o.seed;
  out.dropLast = o.dropLast;
  return out;
}

}  // namespace

DistributedSampler::DistributedSampler(int64_t datasetSize, const ProcessGroup& group, SamplerOptions options)
    : DistributedSampler(datasetSize, group.size(), group.rank(), options) {}

DistributedSampler::DistributedSampler(int64_t datasetSize, int numReplicas, int rank, SamplerOptions options)
    : impl_(std::make_unique<Impl>(
          Impl{sampler::DistributedSampler(datasetSize, samplerOptions(numReplicas, rank, options))})) {}

DistributedSampler::~DistributedSampler() = default;
DistributedSampler::DistributedSampler(DistributedSampler&&) noexcept = default;
DistributedSampler& DistributedSampler::operator=(DistributedSampler&&) noexcept = default;

void DistributedSampler::setEpoch(int64_t epoch) { impl_->sampler.setEpoch(epoch); }
std::vector<int64_t> DistributedSampler::indices() const { return impl_->sampler.indices(); }
int64_t DistributedSampler::numSamples() const { return impl_->sampler.numSamples(); }

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
