#include "libddp/engine/reducer.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>
#include <unordered_set>

#include "common/error.h"
#include "libddp/engine/bucket_assignment.h"

namespace ddp::engine {
namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

// Storage-sharing alias that autograd does not treat as a view: optimizers may
// detach_() a .grad, which autograd refuses on views. With the parameter's own strides when they
// are dense (channels_last included: a permutation of numel() consecutive elements), as PyTorch's
// Reducer lays out bucket views, so the .grad AccumulateGrad makes (which follows the parameter's
// layout) can alias the bucket; else contiguous.
at::Tensor aliasOf(const at::Tensor& flat, int64_t offset, const at::Tensor& like) {
  const auto strides = like.is_non_overlapping_and_dense() ? like.strides().vec() : like.contiguous().strides().vec();
  return at::empty({0}, flat.options()).set_(flat.storage(), flat.storage_offset() + offset, like.sizes(), strides);
}

bool aliases(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.data_ptr() == b.data_ptr() &&
         a.strides() == b.strides();
}

}  // namespace

Reducer::Reducer(ProcessGroup group, std::vector<at::Tensor> params,
                 std::vector<std::string> names, ReducerOptions options)
    : group_(std::move(group)), hookGroup_(group_), params_(std::move(params)), names_(std::move(names)), options_(options) {
  DDP_ENFORCE(names_.size() == params_.size(), "reducer: ", params_.size(), " parameters but ",
              names_.size(), " names");
  for (size_t i = 0; i < params_.size(); ++i) {
    DDP_ENFORCE(params_[i].requires_grad(), "reducer: parameter '", names_[i],
                "' does not require grad; pass only trainable parameters");
    DDP_ENFORCE(params_[i].layout() == c10::kStrided, "reducer: parameter '", names_[i],
                "' is not dense; sparse gradients are not supported");
  }
  c10::NoGradGuard noGrad;
  // Gloo of LibTorch 1.13 has no bfloat16 sum: the all-reduce would fail and poison the group.
  if (!compat::kGlooSumsBFloat16 && options_.compression == WireDtype::kBf16 && group_.backend() == Backend::kGloo) {
    DDP_THROW(ConfigError, "ddp::DdpOptions::compression is bf16 but the gloo backend cannot "
              "all-reduce bfloat16; use fp16 or none (bf16 needs nccl)");
  }
  layout_ = assignBuckets(params_, options_.firstBucketCapBytes, options_.bucketCapBytes);
  slots_.resize(params_.size());
  buckets_.resize(layout_.size());
  for (size_t b = 0; b < layout_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    bucket.params = layout_[b];
    int64_t total = 0;
    for (size_t i : bucket.params) total += params_[i].numel();
    const at::Tensor& first = params_[bucket.params.front()];
    bucket.buffer = at::zeros({total}, first.options().requires_grad(false));
    if (options_.compression != WireDtype::kNone) {
      bucket.wire = at::empty({total}, bucket.buffer.options().dtype(
          options_.compression == WireDtype::kFp16 ? at::kHalf : at::kBFloat16));
    }
    int64_t offset = 0;
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const size_t i = bucket.params[k];
      bucket.views.push_back(aliasOf(bucket.buffer, offset, params_[i]));
      offset += params_[i].numel();
      slots_[i].bucket = b;
      slots_[i].indexInBucket = k;
    }
  }
  // The AccumulateGrad node's post-hook runs after the new gradient has been
  // added into .grad (a tensor hook would run before), exactly as DDP does.
  for (size_t i = 0; i < params_.size(); ++i) {
    Slot& slot = slots_[i];
    slot.accumulator = torch::autograd::impl::grad_accumulator(params_[i]);
    DDP_ENFORCE(slot.accumulator, "reducer: parameter '", names_[i], "' is not a leaf");
    slot.hookKey = slot.accumulator->add_post_hook(
        std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [this, i](const variable_list& outputs, const variable_list&) {
              onGradientReady(i);
              return outputs;
            }));
  }
  if (options_.findUnusedParameters) {
    // Written by the hooks on the host; all-reduced as a copy on the collective device (NCCL: the GPU).
    usedMap_ = at::zeros({static_cast<int64_t>(params_.size())}, at::kInt);
  }
}

Reducer::~Reducer() {
  for (auto& bucket : buckets_) {
    if (bucket.work) {
      try {
        bucket.work->wait();
      } catch (...) {
      }
    }
  }
  for (auto& slot : slots_) {
    if (slot.accumulator) slot.accumulator->del_post_hook(slot.hookKey);
  }
}

void Reducer::setHook(std::shared_ptr<CommHook> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (hook_) {
    DDP_THROW(ConfigError, "ddp::DistributedDataParallel::registerCommHook: a hook (", hookName_,
              ") is registered already; register one hook, once (as register_comm_hook)");
  }
  if (reducedOnce_ || armed_) {
    DDP_THROW(ConfigError, "ddp::DistributedDataParallel::registerCommHook: register the hook before the first "
              "forward and backward (as register_comm_hook)");
  }
  if (options_.compression != WireDtype::kNone) {
    DDP_THROW(ConfigError, "ddp::DistributedDataParallel::registerCommHook: ddp::DdpOptions::compression is set; "
              "compression is a hook itself (fp16CompressHook, bf16CompressHook): use one or the other");
  }
  hookName_ = hook->name();
  hook_ = std::move(hook);
}

void Reducer::setNextDivisor(double divisor) {
  std::lock_guard<std::mutex> lock(mutex_);
  nextDivisor_ = divisor;
}

void Reducer::shadowBackward() {
  std::lock_guard<std::mutex> lock(mutex_);
  c10::NoGradGuard noGrad;
  std::vector<Work> works;
  std::vector<at::Tensor> keep;  // alive until the works are done
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    at::Tensor zeros = at::zeros_like(bucket.buffer);
    keep.push_back(zeros);
    if (hook_) {
      std::vector<at::Tensor> views, params;
      int64_t offset = 0;
      for (size_t i : bucket.params) {
        views.push_back(aliasOf(zeros, offset, params_[i]));
        params.push_back(params_[i]);
        offset += params_[i].numel();
      }
      GradBucket grads(b, b + 1 == buckets_.size(), zeros, views, params);
      works.push_back(hook_->run(grads, hookGroup_));
    } else if (bucket.wire.defined()) {
      at::Tensor wire = at::zeros_like(bucket.wire);
      keep.push_back(wire);
      works.push_back(group_.allReduceAsync(wire));
    } else {
      works.push_back(group_.allReduceAsync(zeros));
    }
  }
  for (auto& work : works) work.wait();
  if (options_.findUnusedParameters && !staticUsedKnown_) {
    at::Tensor unused = at::zeros({static_cast<int64_t>(params_.size())},
                                  at::TensorOptions(at::kInt).device(group_.collectiveDevice()));
    group_.allReduce(unused);
  }
}

void Reducer::reduceWithoutBackward() {
  bool learnStaticGraph = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (armed_) {
      DDP_THROW(CommError, "reducer on rank ", group_.rank(), "/", group_.size(),
                ": the previous backward did not finish its gradient reduction: ", describeMissingLocked());
    }
    armed_ = true;
    hookSeen_ = true;
    nextBucket_ = 0;
    for (auto& slot : slots_) slot.ready = false;
    for (auto& bucket : buckets_) bucket.pending = bucket.params.size();
    if (options_.findUnusedParameters && !staticUsedKnown_) {
      usedMap_.zero_();  // no forward here: this rank used nothing
      learnStaticGraph = options_.staticGraph;
    }
    // In bucket order, so the buckets launch as they fill, in the order every rank launches them.
    for (size_t b = 0; b < buckets_.size(); ++b) {
      for (size_t i : layout_[b]) markReadyLocked(i);
    }
  }
  finalizeBackward();
  if (learnStaticGraph) {
    // Static graph, first synchronising step without a batch here: the parameters the others used
    // are the graph's (it is the same on every rank), so later backwards wait for exactly those.
    std::lock_guard<std::mutex> lock(mutex_);
    unused_.clear();
    const int* used = usedMap_.data_ptr<int>();
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (used[i] == 0) unused_.push_back(i);
    }
  }
}

void Reducer::prepareForBackward(const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(mutex_);
  // A parameter cast or moved after wrapping (net->to(torch::kDouble), set_data of another type) has
  // a new AccumulateGrad node without our hook: its gradients would stay this rank's, the replicas
  // drifting apart with no error. PyTorch's DDP documents it; here it is refused.
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (torch::autograd::impl::try_get_grad_accumulator(params_[i]).get() != slots_[i].accumulator.get()) {
      DDP_THROW(ConfigError, "DistributedDataParallel: parameter '", names_[i], "' was replaced after the model was ",
                "wrapped (a cast or move such as net->to(torch::kDouble), or its .data set to another type): its ",
                "gradients would no longer be all-reduced; cast and move the model before wrapping it (it is now ",
                params_[i].scalar_type(), " on ", params_[i].device().str(), ")");
    }
  }
  // The last forward's output was never backpropagated (a loss computed for a log line with grad
  // mode on, a step abandoned): no gradient arrived and nothing was sent, so this forward takes
  // its place, as PyTorch's DDP lets it.
  if (armed_ && !hookSeen_ && nextBucket_ == 0) armed_ = false;
  if (armed_) {
    DDP_THROW(CommError, "reducer on rank ", group_.rank(), "/", group_.size(),
              ": the previous backward did not finish its gradient reduction: ",
              describeMissingLocked());
  }
  armed_ = true;
  hookSeen_ = false;
  nextBucket_ = 0;
  for (auto& slot : slots_) slot.ready = false;
  for (auto& bucket : buckets_) bucket.pending = bucket.params.size();
  if (!options_.findUnusedParameters) return;
  if (options_.staticGraph && staticUsedKnown_) {  // the graph is the first backward's: unused_ as then
    if (unused_.size() == slots_.size()) markUnusedReadyLocked();
    return;
  }
  unused_.clear();
  usedMap_.zero_();
  // Every node backward can reach from the outputs; an AccumulateGrad outside
  // this set will never fire its hook.
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (const auto& out : outputs) {
    if (out.defined() && out.grad_fn()) stack.push_back(out.grad_fn().get());
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    for (const auto& edge : node->next_edges()) {
      if (edge.function && !seen.count(edge.function.get())) stack.push_back(edge.function.get());
    }
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!seen.count(slots_[i].accumulator.get())) unused_.push_back(i);
  }
  // Nothing reachable at all: no hook will fire, so no final callback either.
  if (unused_.size() == slots_.size()) {
    markUnusedReadyLocked();
  }
}

void Reducer::onGradientReady(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) return;  // accumulation micro-batch (no_sync): local only
  if (!hookSeen_) {
    hookSeen_ = true;
    // Runs when the whole backward is done, before backward() returns.
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finalizeBackward(); });
    markUnusedReadyLocked();
  }
  if (options_.findUnusedParameters && !staticUsedKnown_) usedMap_.data_ptr<int>()[index] = 1;
  markReadyLocked(index);
}

void Reducer::markUnusedReadyLocked() {
  for (size_t i : unused_) {
    if (!slots_[i].ready) markReadyLocked(i);
  }
}

void Reducer::markReadyLocked(size_t index) {
  Slot& slot = slots_[index];
  DDP_ENFORCE(!slot.ready, "reducer: parameter '", names_[index],
              "' was marked ready twice in one backward (used by a reentrant backward?)");
  slot.ready = true;
  Bucket& bucket = buckets_[slot.bucket];
  at::Tensor& view = bucket.views[slot.indexInBucket];
  const at::Tensor& param = params_[index];
  at::Tensor grad = param.grad();
  c10::NoGradGuard noGrad;
  if (!grad.defined()) {
    view.zero_();  // unused here (find_unused_parameters): contributes zeros
  } else if (!aliases(grad, view)) {
    view.copy_(grad);
    // From now on AccumulateGrad adds into the bucket in place: no copies either way.
    if (options_.gradientAsBucketView) param.mutable_grad() = view;
  }
  if (--bucket.pending == 0) launchReadyBucketsLocked();
}

void Reducer::zeroGrad() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (armed_ && hookSeen_) {
    DDP_THROW(CommError, "reducer on rank ", group_.rank(), "/", group_.size(),
              ": zero_grad during a backward that is reducing the gradients; zero them before the forward");
  }
  c10::NoGradGuard noGrad;
  for (Bucket& bucket : buckets_) {
    bool views = false;
    bool others = false;
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const at::Tensor& grad = params_[bucket.params[k]].grad();
      if (!grad.defined()) continue;
      (aliases(grad, bucket.views[k]) ? views : others) = true;
    }
    if (views && !others) {
      bucket.buffer.zero_();  // an undefined .grad's slice too: its next gradient is copied over it
      continue;
    }
    for (size_t i : bucket.params) {
      at::Tensor grad = params_[i].grad();
      if (grad.defined()) grad.zero_();
    }
  }
}

void Reducer::launchReadyBucketsLocked() {
  // Launched in bucket order on every rank, or collectives mismatch and hang.
  const double divisor = nextDivisor_ > 0 ? nextDivisor_ : static_cast<double>(group_.size());
  while (nextBucket_ < buckets_.size() && buckets_[nextBucket_].pending == 0) {
    const size_t index = nextBucket_++;
    Bucket& bucket = buckets_[index];
    if (hook_) {
      std::vector<at::Tensor> params;
      for (size_t i : bucket.params) params.push_back(params_[i]);
      GradBucket grads(index, index + 1 == buckets_.size(), bucket.buffer, bucket.views, params);
      bucket.work = hook_->run(grads, hookGroup_);
    } else if (bucket.wire.defined()) {
      // Cast, then divide in the wire dtype: fp16_compress_hook's arithmetic, bit for bit.
      bucket.wire.copy_(bucket.buffer);
      if (divisor != 1.0) bucket.wire.div_(divisor);  // x / 1 is x: no kernel for it
      bucket.work = group_.allReduceAsync(bucket.wire);
    } else {
      if (divisor != 1.0) bucket.buffer.div_(divisor);  // pre-divide, then SUM: Gloo has no AVG
      bucket.work = group_.allReduceAsync(bucket.buffer);
    }
  }
}

void Reducer::finalizeBackward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) return;
  c10::NoGradGuard noGrad;
  const auto start = std::chrono::steady_clock::now();
  // Launched works must finish on every path: the peers are running them too.
  for (auto& bucket : buckets_) {
    if (!bucket.work) continue;
    Work work = std::move(*bucket.work);
    bucket.work.reset();
    work.wait();
    if (bucket.wire.defined()) bucket.buffer.copy_(bucket.wire);
  }
  if (nextBucket_ < buckets_.size()) {
    DDP_THROW(CommError, "reducer on rank ", group_.rank(), "/", group_.size(), ": ",
              describeMissingLocked());
  }
  const int* used = nullptr;
  if (options_.findUnusedParameters) {
    // A parameter no rank used keeps its .grad as it was, as in DDP. With a static graph the first
    // backward's global map holds for every later one: no search and no all-reduce any more.
    if (!staticUsedKnown_) {
      at::Tensor usedEverywhere = usedMap_.to(group_.collectiveDevice());
      group_.allReduce(usedEverywhere);
      usedMap_.copy_(usedEverywhere);  // back on the host: blocks until the GPU is done
      staticUsedKnown_ = options_.staticGraph;
    }
    used = usedMap_.data_ptr<int>();
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (used && used[i] == 0) continue;
    const at::Tensor& view = buckets_[slots_[i].bucket].views[slots_[i].indexInBucket];
    at::Tensor grad = params_[i].grad();
    if (options_.gradientAsBucketView) {
      if (!aliases(grad, view)) params_[i].mutable_grad() = view;
    } else if (grad.defined()) {
      grad.copy_(view);
    } else {
      params_[i].mutable_grad() = view.clone();
    }
  }
  lastWaitSeconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  armed_ = false;
  reducedOnce_ = true;
  nextDivisor_ = 0;
}

std::string Reducer::describeMissingLocked() const {
  std::string names;
  size_t count = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].ready) continue;
    if (count++ < 8) names += (names.empty() ? "" : ", ") + names_[i];
  }
  if (count > 8) names += ", ...";
  return detail::concat(
      count, " parameter(s) received no gradient in this backward (", names,
      "), so their buckets were never all-reduced. Make every parameter take part in the loss, "
      "or set ddp::DdpOptions::findUnusedParameters = true (DDP's find_unused_parameters)");
}

}  // namespace ddp::engine
