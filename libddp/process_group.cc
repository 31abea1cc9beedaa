// ddp::ProcessGroup's public face: the collectives (sync and async, Work), sub-groups (newGroup)
// and destroy(), each through the group's Impl (libddp/process_group_impl.h). Its making:
// init_process_group.cc.
#include <c10/core/GradMode.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group.h"
#include "common/error.h"
#include "ddp/ddp.h"
#include "libddp/flat_tensors.h"
#include "libddp/internal.h"
#include "libddp/process_group_impl.h"

namespace ddp {

int GroupStart::rank() const { return impl_->rank; }
int GroupStart::size() const { return impl_->size; }
int GroupStart::localRank() const { return impl_->localRank; }
int GroupStart::localSize() const { return impl_->localSize; }
c10::Device GroupStart::device() const { return impl_->device; }
std::chrono::milliseconds GroupStart::timeout() const { return impl_->timeout; }

ProcessGroup::ProcessGroup(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {
  if (!impl_) {
    DDP_THROW(ConfigError, "ddp::ProcessGroup: no group (a null handle); get one from ddp::initProcessGroup() and "
              "pass it on (copies share the group)");
  }
}
ProcessGroup::Impl& ProcessGroup::impl() const {
  if (!impl_) {
    DDP_THROW(ConfigError, "ddp::ProcessGroup: this handle was moved from; use the handle it was moved to (or a "
              "copy: copies share the group)");
  }
  return *impl_;
}

int ProcessGroup::rank() const { return impl().rank_; }
int ProcessGroup::size() const { return impl().size_; }
int ProcessGroup::localRank() const { return impl().localRank; }
int ProcessGroup::localSize() const { return impl().localSize; }
c10::Device ProcessGroup::device() const { return impl().rankDevice; }
Backend ProcessGroup::backend() const { return impl().backendKind; }
c10::Device ProcessGroup::collectiveDevice() const { return impl().collectiveDevice; }
bool ProcessGroup::destroyed() const { return impl().destroyed; }

namespace {

void checkRank(const ProcessGroup& group, int peer, const char* what) {
  if (peer < 0 || peer >= group.size()) {
    DDP_THROW(ConfigError, "ddp::ProcessGroup::", what, ": rank ", peer, " is not in the group (ranks 0-", group.size() - 1, ")");
  }
}

void checkPeer(const ProcessGroup& group, int peer, const char* what) {
  checkRank(group, peer, what);
  if (peer == group.rank()) DDP_THROW(ConfigError, "ddp::ProcessGroup::", what, ": rank ", peer, " is this rank");
}

// A default-constructed at::Tensor has no storage, device or dtype: LibTorch's own error for it
// is "tensor does not have a device" with a backtrace.
void checkDefined(const at::Tensor& t, const char* what) {
  if (!t.defined()) {
    DDP_THROW(ConfigError, "ddp::ProcessGroup::", what, ": the tensor is undefined (a default-constructed "
              "at::Tensor, or a .grad() no backward has set); pass one that holds data");
  }
}

// size() tensors of one shape and dtype, as reduceScatter and allToAll take them.
void checkParts(const ProcessGroup& group, const std::vector<at::Tensor>& parts, const char* what) {
  if (static_cast<int>(parts.size()) != group.size()) {
    DDP_THROW(ConfigError, "ddp::ProcessGroup::", what, ": ", parts.size(), " tensors for ", group.size(),
              " ranks; pass one per rank");
  }
  for (const at::Tensor& t : parts) {
    checkDefined(t, what);
    if (t.sizes() != parts.front().sizes() || t.scalar_type() != parts.front().scalar_type()) {
      DDP_THROW(ConfigError, "ddp::ProcessGroup::", what, ": the tensors must have one shape and dtype (",
                parts.front().sizes(), " ", parts.front().scalar_type(), " vs ", t.sizes(), ")");
    }
  }
}

std::vector<at::Tensor> onDevice(const std::vector<at::Tensor>& tensors, c10::Device device) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const at::Tensor& t : tensors) out.push_back(t.to(device).contiguous());
  return out;
}

}  // namespace

struct Work::Impl {
  // Destroyed in reverse: an unwaited collective finishes before `next` lets go of its tensor.
  std::function<void()> next;               // runs once the below are done
  std::unique_ptr<Impl> first;              // Work::then: what runs before
  std::unique_ptr<comm::PendingWork> work;  // a collective in flight
  void wait() {
    if (auto before = std::move(first)) before->wait();
    if (auto pending = std::move(work)) pending->wait();
    if (auto after = std::move(next)) after();
  }
};

Work::Work() = default;
Work::Work(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Work::~Work() = default;  // a pending collective's own destructor waits for it
Work::Work(Work&&) noexcept = default;
Work& Work::operator=(Work&&) noexcept = default;

void Work::wait() {
  if (auto impl = std::move(impl_)) impl->wait();
}

Work Work::then(Work first, std::function<void()> next) {
  auto impl = std::make_unique<Impl>();
  impl->first = std::move(first.impl_);
  impl->next = std::move(next);
  return Work(std::move(impl));
}

namespace {

Work workOf(std::unique_ptr<comm::PendingWork> pending, std::function<void()> next = {}) {
  auto work = std::make_unique<Work::Impl>();
  work->work = std::move(pending);
  work->next = std::move(next);
  return Work(std::move(work));
}

// Whether the backend takes `tensor` as it is: dense on its collective device; anywhere for a group of
// one (nothing moves); a CUDA tensor for Gloo's all_reduce and broadcast (`glooTakesCuda`), which
// ProcessGroupGloo runs from the GPU itself, so the DDP reducer's buckets of ranks that share a GPU
// over Gloo stay there and overlap backward as before (no host copy inside an autograd hook).
bool takesAsIs(const ProcessGroup::Impl& group, const at::Tensor& tensor, bool glooTakesCuda) {
  if (!tensor.is_contiguous()) return false;
  if (tensor.device() == group.device() || group.backendKind == Backend::kLocal) return true;
  return glooTakesCuda && tensor.is_cuda() && group.backendKind == Backend::kGloo;
}

// Starts `start` on `tensor` where the backend takes it; copies back by wait() when it had to move.
template <typename Start>
Work onCollectiveDevice(const ProcessGroup::Impl& group, at::Tensor& tensor, bool glooTakesCuda, Start start) {
  if (takesAsIs(group, tensor, glooTakesCuda)) return workOf(start(tensor));
  auto moved = std::make_shared<at::Tensor>(tensor.to(group.device()).contiguous());
  auto pending = start(*moved);
  return workOf(std::move(pending), [target = tensor, moved]() mutable { target.copy_(*moved); });
}

}  // namespace

// A call's own label, else the handle's (withLabel()).
template <typename Options>
Options ProcessGroup::labelled(const Options& options) const {
  Options out = options;
  if (out.label.empty()) out.label = label_;
  return out;
}

ProcessGroup ProcessGroup::withLabel(std::string label) const {
  impl();  // a moved-from handle says so
  ProcessGroup out(impl_);
  out.label_ = std::move(label);
  return out;
}

Work ProcessGroup::allReduceAsync(at::Tensor& tensor, const AllReduceOptions& options) {
  Impl& group = impl();
  group.live("all_reduce");
  checkDefined(tensor, "allReduce");
  return onCollectiveDevice(group, tensor, /*glooTakesCuda=*/true,
                            [&, o = labelled(options)](at::Tensor& t) { return group.allReduce(t, o); });
}

void ProcessGroup::allReduce(at::Tensor& tensor, const AllReduceOptions& options) {
  allReduceAsync(tensor, options).wait();
}

Work ProcessGroup::allGatherAsync(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                  const CollectiveOptions& options) {
  Impl& group = impl();
  group.live("all_gather");
  checkDefined(input, "allGather");
  auto staged = std::make_shared<std::vector<at::Tensor>>();
  auto pending = group.allGather(*staged, input.to(group.device()).contiguous(), labelled(options));
  outputs.assign(static_cast<size_t>(size()), at::Tensor());
  return workOf(std::move(pending), [&outputs, staged, device = input.device()] {
    for (size_t r = 0; r < staged->size(); ++r) outputs[r] = (*staged)[r].to(device);
  });
}

std::vector<at::Tensor> ProcessGroup::allGather(const at::Tensor& input, const CollectiveOptions& options) {
  std::vector<at::Tensor> out;
  allGatherAsync(out, input, options).wait();
  return out;
}

Work ProcessGroup::reduceScatterAsync(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                                      const ReduceScatterOptions& options) {
  Impl& group = impl();
  group.live("reduce_scatter");
  checkParts(*this, inputs, "reduceScatter");
  auto staged = std::make_shared<at::Tensor>();
  auto pending = group.reduceScatter(*staged, onDevice(inputs, group.device()), labelled(options));
  return workOf(std::move(pending), [&output, staged, device = inputs.front().device()] { output = staged->to(device); });
}

at::Tensor ProcessGroup::reduceScatter(const std::vector<at::Tensor>& inputs, const ReduceScatterOptions& options) {
  at::Tensor out;
  reduceScatterAsync(out, inputs, options).wait();
  return out;
}

Work ProcessGroup::allToAllAsync(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                                 const CollectiveOptions& options) {
  Impl& group = impl();
  group.live("all_to_all");
  checkParts(*this, inputs, "allToAll");
  auto staged = std::make_shared<std::vector<at::Tensor>>();
  auto pending = group.allToAll(*staged, onDevice(inputs, group.device()), labelled(options));
  outputs.assign(static_cast<size_t>(size()), at::Tensor());
  return workOf(std::move(pending), [&outputs, staged, device = inputs.front().device()] {
    for (size_t r = 0; r < staged->size(); ++r) outputs[r] = (*staged)[r].to(device);
  });
}

std::vector<at::Tensor> ProcessGroup::allToAll(const std::vector<at::Tensor>& inputs, const CollectiveOptions& options) {
  std::vector<at::Tensor> out;
  allToAllAsync(out, inputs, options).wait();
  return out;
}

Work ProcessGroup::sendAsync(const at::Tensor& tensor, int dst, const CollectiveOptions& options) {
  Impl& group = impl();
  group.live("send");
  checkDefined(tensor, "send");
  checkPeer(*this, dst, "send");
  auto moved = std::make_shared<at::Tensor>(tensor.to(group.device()).contiguous());
  auto pending = group.send(*moved, dst, labelled(options));
  return workOf(std::move(pending), [moved] {});  // `moved` lives until the send is done
}

void ProcessGroup::send(const at::Tensor& tensor, int dst, const CollectiveOptions& options) {
  sendAsync(tensor, dst, options).wait();
}

Work ProcessGroup::recvAsync(at::Tensor& tensor, int src, const CollectiveOptions& options) {
  Impl& group = impl();
  group.live("recv");
  checkDefined(tensor, "recv");
  checkPeer(*this, src, "recv");
  return onCollectiveDevice(group, tensor, /*glooTakesCuda=*/false,
                            [&, o = labelled(options)](at::Tensor& t) { return group.recv(t, src, o); });
}

void ProcessGroup::recv(at::Tensor& tensor, int src, const CollectiveOptions& options) {
  recvAsync(tensor, src, options).wait();
}

Work ProcessGroup::broadcastAsync(at::Tensor& tensor, const BroadcastOptions& options) {
  Impl& group = impl();
  group.live("broadcast");
  checkRank(*this, options.root, "broadcast");
  checkDefined(tensor, "broadcast");
  return onCollectiveDevice(group, tensor, /*glooTakesCuda=*/true,
                            [&, o = labelled(options)](at::Tensor& t) { return group.broadcast(t, o); });
}

void ProcessGroup::broadcast(at::Tensor& tensor, const BroadcastOptions& options) {
  broadcastAsync(tensor, options).wait();
}

void ProcessGroup::broadcast(const std::vector<at::Tensor>& tensors, const BroadcastOptions& options) {
  Impl& group = impl();
  group.live("broadcast");
  checkRank(*this, options.root, "broadcast");
  for (const at::Tensor& t : tensors) checkDefined(t, "broadcast");
  if (size() == 1 || tensors.empty()) return;
  c10::NoGradGuard noGrad;
  at::Tensor buffer = flat::flatten(tensors);
  broadcast(buffer, options);
  flat::unflatten(buffer, tensors);
}

Work ProcessGroup::barrierAsync(const CollectiveOptions& options) { return workOf(impl().barrier(labelled(options))); }

void ProcessGroup::barrier(const CollectiveOptions& options) { barrierAsync(options).wait(); }


std::optional<ProcessGroup> ProcessGroup::newGroup(const std::vector<int>& ranks) {
  Impl& world = impl();
  world.live("newGroup");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.empty() || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() || sorted.front() < 0 ||
      sorted.back() >= world.size()) {
    DDP_THROW(ConfigError, "ddp::ProcessGroup::newGroup: the ranks must be distinct members of this group (0-",
              world.size() - 1, "), at least one");
  }
  const int index = world.subgroups++;  // every rank calls newGroup in the same order, as new_group
  if (world.store) {
    // Every rank must name the same ranks (new_group's rule): the first to come records its list;
    // a rank with another list stops here at once, not at the end of the group's timeout.
    std::string list;
    for (int r : sorted) {
      if (!list.empty()) list += ',';
      list += std::to_string(r);
    }
    const std::vector<uint8_t> want(list.begin(), list.end());
    const std::vector<uint8_t> got =
        world.store->compareSet("ddp/subgroup_ranks/" + std::to_string(index), std::vector<uint8_t>(), want);
    if (got != want) {
      DDP_THROW(ConfigError, "ddp::ProcessGroup::newGroup (call ", index + 1, "): rank ", world.rank(), " names ranks [",
                list, "] but another rank named [", std::string(got.begin(), got.end()), "]: every rank must call ",
                "newGroup with the same ranks, its calls in the same order");
    }
  }
  const auto mine = std::find(sorted.begin(), sorted.end(), world.rank());
  if (mine == sorted.end()) return std::nullopt;
  auto impl = std::make_shared<Impl>();
  impl->groupIndex = index + 1;
  impl->checkCollectives = world.checkCollectives;
  impl->timeout = world.timeout;
  impl->rankDevice = world.rankDevice;
  impl->localRank = world.localRank;
  impl->localSize = world.localSize;
  if (sorted.size() == 1) {
    impl->owned = std::make_unique<comm::LocalCommunicator>();
  } else {
    if (!world.store || !world.groupOptions) {
      DDP_THROW(ConfigError, "ddp::ProcessGroup::newGroup: this group was not made by ddp::initProcessGroup, so it "
                "has no store to meet at");
    }
    comm::ProcessGroupOptions options = *world.groupOptions;
    options.rank = static_cast<int>(mine - sorted.begin());
    options.worldSize = static_cast<int>(sorted.size());
    impl->store = c10::make_intrusive<c10d::PrefixStore>("ddp/subgroup/" + std::to_string(index), world.store);
    impl->owned = comm::makeCommunicator(impl->store, options);
    impl->groupOptions = options;
  }
  impl->attach(impl->owned.get());
  return ProcessGroup(std::move(impl));
}


void ProcessGroup::waitForCollectives() { impl().awaitCompletion(); }

void ProcessGroup::destroy(const char* file, int line) {
  Impl& s = impl();
  if (s.destroyed) return;
  const std::string where = std::string(file ? file : "?") + ":" + std::to_string(line);
  s.destroyCollectively(where);
  s.destroyed = true;
  s.destroyedAt = where;
  // The communicator goes; the Impl stays with every handle (DDP wrappers, checkpointers), which
  // now get ConfigError from live() instead of a freed communicator.
  s.owned.reset();
  s.comm = nullptr;
  s.store.reset();
}

}  // namespace ddp
