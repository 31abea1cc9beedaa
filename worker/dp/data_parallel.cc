#include "worker/dp/data_parallel.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <set>
#include <type_traits>

#include "common/error.h"
#include "worker/dp/replica_threads.h"

namespace ddp::worker::dp {
namespace {

/// A new autograd Node, held the way this LibTorch holds nodes (as it holds a leaf's AccumulateGrad):
/// shared_ptr up to 2.11 (1.13 included), intrusive_ptr in later 2.x.
template <typename NodeT, typename... Args>
auto makeNode(Args&&... args) {
  using Held = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));
  if constexpr (std::is_same_v<Held, std::shared_ptr<torch::autograd::Node>>) {
    return std::shared_ptr<NodeT>(new NodeT(std::forward<Args>(args)...));
  } else {
    return c10::make_intrusive<NodeT>(std::forward<Args>(args)...);
  }
}

/// One copy of the master on one device, run by one thread.
struct Replica {
  torch::nn::AnyModule module;
  std::vector<at::Tensor> params;   // same order as the master's parameters()
  std::vector<at::Tensor> buffers;  // same order as the master's buffers()
  c10::Device device{c10::kCPU};
  bool sharesParams = false;   // same device as the master: parameters alias its storage
  bool sharesBuffers = false;  // replica 0: its buffer updates (e.g. running stats) are the master's
};

/// Module::clone() re-runs reset(), which draws fresh initial values from the
/// default generator; keep that from shifting the caller's random stream.
torch::nn::AnyModule cloneKeepingRng(const torch::nn::AnyModule& master, c10::Device device) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  at::Tensor state;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    state = gen.get_state();
  }
  auto copy = master.clone(device);  // draws, and locks the generator itself
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
  return copy;
}

}  // namespace

std::vector<int64_t> scatterSizes(int64_t batch, int64_t replicas) {
  DDP_ENFORCE(replicas >= 1, "DataParallel needs at least one replica, got ", replicas);
  // torch.chunk(batch, replicas), as nn.DataParallel's scatter splits: parts of ceil(batch / replicas)
  // rows, the last one smaller, and fewer parts than replicas where they run out (9 over 4: 3, 3, 3).
  const int64_t part = (batch + replicas - 1) / replicas;
  std::vector<int64_t> sizes;
  for (int64_t left = batch; left > 0; left -= part) sizes.push_back(std::min(part, left));
  return sizes;
}

struct DataParallel::Impl {
  torch::nn::AnyModule master;
  std::vector<at::Tensor> masterParams;
  std::vector<at::Tensor> masterBuffers;
  std::vector<c10::Device> devices;
  c10::Device outputDevice{c10::kCPU};
  bool anyCuda = false;
  // One replica on the master's device, gathering there: forward() calls the master itself, so no
  // replica, replica thread or gather is built (torch.nn.DataParallel with one device).
  bool direct = false;
  std::vector<Replica> replicas;
  std::unique_ptr<ReplicaThreads> threads;
  int lastUsed = 0;
};

namespace {

using torch::autograd::variable_list;

/// The gathered output's grad_fn. Its next edges are the master's parameters:
/// backward splits the output gradient like the forward split the batch, runs
/// every replica's backward, and returns the replica gradients summed in
/// replica order (deterministic) on the master's device.
class DataParallelBackward : public torch::autograd::Node {
 public:
  DataParallelBackward(std::shared_ptr<DataParallel::Impl> impl, std::vector<at::Tensor> outputs,
                       std::vector<int64_t> sizes)
      : impl_(std::move(impl)), outputs_(std::move(outputs)), sizes_(std::move(sizes)) {}

  std::string name() const override { return "DataParallelBackward"; }
  void release_variables() override { outputs_.clear(); }

  variable_list apply(variable_list&& grads) override {
    TORCH_CHECK(!outputs_.empty(),
                "DataParallel: backward through the same forward twice (retain_graph is not supported)");
    variable_list result(impl_->masterParams.size());
    if (grads.empty() || !grads[0].defined()) return result;
    const int used = static_cast<int>(outputs_.size());
    const auto chunks = grads[0].split_with_sizes(sizes_, 0);
    std::vector<variable_list> perReplica(static_cast<std::size_t>(used));

    if (!impl_->anyCuda) {
      // CPU: the engine runs backward on the calling thread, so one backward per
      // replica thread is what makes the replicas' backward parallel.
      impl_->threads->run(used, [&](int i) {
        const auto& r = impl_->replicas[static_cast<std::size_t>(i)];
        perReplica[static_cast<std::size_t>(i)] =
            torch::autograd::grad({outputs_[static_cast<std::size_t>(i)]}, r.params,
                                  {chunks[static_cast<std::size_t>(i)]}, /*retain_graph=*/false,
                                  /*create_graph=*/false, /*allow_unused=*/true);
      });
    } else {
      // CUDA: this node runs on the output device's autograd thread. One reentrant
      // grad() over all replicas lets the engine run each device's part on that
      // device's own thread (waiting here on other threads could deadlock it).
      variable_list outs, inputs, gradOuts;
      for (int i = 0; i < used; ++i) {
        const auto& r = impl_->replicas[static_cast<std::size_t>(i)];
        outs.push_back(outputs_[static_cast<std::size_t>(i)]);
        gradOuts.push_back(chunks[static_cast<std::size_t>(i)].to(r.device, /*non_blocking=*/true));
        inputs.insert(inputs.end(), r.params.begin(), r.params.end());
      }
      const auto flat = torch::autograd::grad(outs, inputs, gradOuts, false, false, true);
      const std::size_t n = impl_->masterParams.size();
      for (int i = 0; i < used; ++i) {
        perReplica[static_cast<std::size_t>(i)].assign(flat.begin() + static_cast<std::ptrdiff_t>(i * n),
                                                       flat.begin() + static_cast<std::ptrdiff_t>((i + 1) * n));
      }
    }
    outputs_.clear();
    reduceIntoMaster(perReplica, result);
    return result;
  }

 private:
  void reduceIntoMaster(std::vector<variable_list>& perReplica, variable_list& result) {
    const c10::Device master = impl_->devices.front();
    const std::size_t n = impl_->masterParams.size();
    for (std::size_t k = 0; k < n; ++k) {
      for (auto& g : perReplica) {
        if (g[k].defined()) g[k] = g[k].to(master, /*non_blocking=*/false).contiguous();
      }
      for (auto& g : perReplica) {
        if (g[k].defined() && !result[k].defined()) result[k] = at::empty_like(g[k]);
      }
    }
    // Sum each parameter's gradient in replica order; the CPU threads each take
    // a contiguous slice of every gradient.
    const int parts = impl_->anyCuda ? 1 : impl_->threads->size();
    auto sumSlice = [&](int part) {
      for (std::size_t k = 0; k < n; ++k) {
        if (!result[k].defined()) continue;
        const int64_t len = result[k].numel();
        const int64_t lo = len * part / parts;
        const int64_t hi = len * (part + 1) / parts;
        if (hi <= lo) continue;
        at::Tensor dst = result[k].view({-1}).narrow(0, lo, hi - lo);
        bool first = true;
        for (const auto& g : perReplica) {
          if (!g[k].defined()) continue;
          const at::Tensor src = g[k].view({-1}).narrow(0, lo, hi - lo);
          if (first) dst.copy_(src);
          else dst.add_(src);
          first = false;
        }
      }
    };
    if (parts == 1) sumSlice(0);
    else impl_->threads->run(parts, sumSlice);
  }

  std::shared_ptr<DataParallel::Impl> impl_;
  std::vector<at::Tensor> outputs_;  // each replica's output, with its replica's graph
  std::vector<int64_t> sizes_;
};

}  // namespace

DataParallel::DataParallel(torch::nn::AnyModule master, const DataParallelOptions& options)
    : impl_(std::make_shared<Impl>()) {
  DDP_ENFORCE(!options.devices.empty(), "DataParallel needs at least one device");
  Impl& s = *impl_;
  s.master = std::move(master);
  s.devices = options.devices;
  s.outputDevice = options.outputDevice.value_or(s.devices.front());
  std::set<int> seen;  // CUDA device indices
  for (const auto& d : s.devices) {
    if (d.is_cuda()) {
      s.anyCuda = true;
      if (!seen.insert(static_cast<int>(d.index())).second) {
        DDP_THROW(ConfigError, "dp.device_ids lists GPU ", static_cast<int>(d.index()),
                  " twice; each GPU can hold one replica");
      }
    } else if (!d.is_cpu()) {
      DDP_THROW(ConfigError, "DataParallel runs on CPU or CUDA devices, not ", d.str());
    }
  }
  if (s.anyCuda && std::any_of(s.devices.begin(), s.devices.end(), [](auto d) { return d.is_cpu(); })) {
    DDP_THROW(ConfigError, "DataParallel: do not mix CPU and CUDA replicas");
  }

  torch::nn::Module& module = *s.master.ptr();
  s.masterParams = module.parameters(/*recurse=*/true);
  s.masterBuffers = module.buffers(/*recurse=*/true);
  const c10::Device home = s.devices.front();
  auto checkHome = [&](const std::vector<at::Tensor>& tensors, const char* what) {
    for (const auto& t : tensors) {
      if (t.device() != home) {
        DDP_THROW(ConfigError, "DataParallel: the module's ", what, " must be on device_ids[0] (",
                  home.str(), ") before replication, but one is on ", t.device().str(),
                  "; move the model there first (model->to(", home.str(),
                  ")), as torch.nn.DataParallel requires");
      }
    }
  };
  checkHome(s.masterParams, "parameters");
  checkHome(s.masterBuffers, "buffers");
  s.direct = s.devices.size() == 1 && s.outputDevice == home;
  if (s.direct) return;

  ReplicaThreadsOptions threadOptions;
  threadOptions.threads = static_cast<int>(s.devices.size());
  threadOptions.intraOpThreads = s.anyCuda ? 0 : options.intraOpThreadsPerReplica;
  s.threads = std::make_unique<ReplicaThreads>(threadOptions);

  // The replicas' structure is built once; "replicate" each step then only
  // broadcasts values (CUDA) or nothing at all (same device: aliased storage).
  for (std::size_t i = 0; i < s.devices.size(); ++i) {
    Replica r;
    r.device = s.devices[i];
    r.module = cloneKeepingRng(s.master, r.device);
    r.params = r.module.ptr()->parameters(/*recurse=*/true);
    r.buffers = r.module.ptr()->buffers(/*recurse=*/true);
    DDP_ENFORCE_EQ(r.params.size(), s.masterParams.size());
    DDP_ENFORCE_EQ(r.buffers.size(), s.masterBuffers.size());
    r.sharesParams = r.device == home;
    r.sharesBuffers = i == 0;
    if (r.sharesParams) {
      for (std::size_t k = 0; k < r.params.size(); ++k) r.params[k].set_data(s.masterParams[k].data());
    }
    if (r.sharesBuffers) {
      for (std::size_t k = 0; k < r.buffers.size(); ++k) r.buffers[k].set_data(s.masterBuffers[k].data());
    }
    s.replicas.push_back(std::move(r));
  }
}

DataParallel::~DataParallel() = default;

at::Tensor DataParallel::forward(const at::Tensor& input) {
  Impl& s = *impl_;
  DDP_ENFORCE(input.dim() >= 1 && input.size(0) >= 1, "DataParallel: input needs at least one row along dim 0");
  DDP_ENFORCE(!input.requires_grad(), "DataParallel: inputs that require grad are not supported");
  // torch.nn.DataParallel with one device calls the module itself (`if len(self.device_ids) == 1:
  // return self.module(...)`): no replica, scatter, gather or second backward. Here when that one
  // replica is the master's own device and gathers there.
  if (s.direct) {
    s.lastUsed = 1;
    c10::OptionalDeviceGuard guard;  // the replica's device is current while it runs, as on its thread
    if (s.outputDevice.is_cuda()) guard.reset_device(s.outputDevice);
    return s.master.forward(input.to(s.outputDevice, /*non_blocking=*/true));
  }
  const auto sizes = scatterSizes(input.size(0), static_cast<int64_t>(s.replicas.size()));
  const int used = static_cast<int>(sizes.size());
  std::vector<int64_t> offsets(sizes.size(), 0);
  for (std::size_t i = 1; i < sizes.size(); ++i) offsets[i] = offsets[i - 1] + sizes[i - 1];
  const bool training = s.master.ptr()->is_training();
  std::vector<at::Tensor> outputs(sizes.size());

  // replicate (broadcast what is not shared) + scatter + parallel apply.
  s.threads->run(used, [&](int i) {
    Replica& r = s.replicas[static_cast<std::size_t>(i)];
    c10::OptionalDeviceGuard guard;
    if (r.device.is_cuda()) guard.reset_device(r.device);
    r.module.ptr()->train(training);
    {
      c10::NoGradGuard noGrad;
      if (!r.sharesParams) {
        for (std::size_t k = 0; k < r.params.size(); ++k) r.params[k].copy_(s.masterParams[k], true);
      }
      if (!r.sharesBuffers) {
        for (std::size_t k = 0; k < r.buffers.size(); ++k) r.buffers[k].copy_(s.masterBuffers[k], true);
      }
    }
    const at::Tensor x = input.narrow(0, offsets[static_cast<std::size_t>(i)], sizes[static_cast<std::size_t>(i)])
                             .to(r.device, /*non_blocking=*/true);
    at::Tensor y = r.module.forward(x);
    DDP_ENFORCE(y.dim() >= 1 && y.size(0) == x.size(0),
                "DataParallel: a replica's output must keep dim 0 (rows) of its input");
    outputs[static_cast<std::size_t>(i)] = std::move(y);
  });
  s.lastUsed = used;

  // gather
  const bool connect = c10::GradMode::is_enabled() && outputs.front().requires_grad();
  at::Tensor gathered;
  {
    c10::NoGradGuard noGrad;
    std::vector<at::Tensor> parts;
    for (const auto& o : outputs) parts.push_back(o.detach().to(s.outputDevice));
    gathered = parts.size() == 1 ? parts.front().clone() : at::cat(parts, 0);
  }
  if (!connect) return gathered;
  auto node = makeNode<DataParallelBackward>(impl_, std::move(outputs), sizes);
  node->set_next_edges(torch::autograd::collect_next_edges(at::ArrayRef<at::Tensor>(s.masterParams)));
  torch::autograd::set_history(gathered, node);
  return gathered;
}

const std::vector<c10::Device>& DataParallel::devices() const { return impl_->devices; }
c10::Device DataParallel::outputDevice() const { return impl_->outputDevice; }
int DataParallel::lastReplicasUsed() const { return impl_->lastUsed; }

}  // namespace ddp::worker::dp
