#include "worker/train/graph_step.h"

#include <ATen/autocast_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "common/error.h"
#include "ddp/autocast.h"
#include "ddp/clip_grad.h"
#include "ddp/fused_optim.h"
#include "ddp/non_finite.h"
#include "worker/train/finite_check.h"
#include "worker/train/loss.h"

namespace ddp::worker {

int64_t GraphStep::run(const std::vector<std::vector<int64_t>>& batches, data::BatchLoader& loader,
                       const StepPlace& place) {
  const auto& batch = batches[place.first];  // accumulate_steps 1 and padded shards: every rank has one
  if (s_.sampleLog != nullptr) s_.sampleLog->write(place.epoch, s_.result.steps + 1, batch);
  // The batch as the loader made it on the host (page-locked with data.pin_memory): copied straight
  // into the static inputs, or (another shape) to the device for an uncaptured step.
  data::Batch host = loader.nextOnHost();
  s_.lr = s_.schedule.apply(s_.optimizer, s_.result.steps);
  {
    c10::NoGradGuard noGrad;
    if (!staticImages_.defined()) {
      const at::TensorOptions onDevice = at::TensorOptions().device(s_.device);
      staticImages_ = at::empty(host.images.sizes(), onDevice.dtype(host.images.scalar_type()));
      staticLabels_ = at::empty(host.labels.sizes(), onDevice.dtype(host.labels.scalar_type()));
      lrTensor_ = at::zeros({}, onDevice.dtype(at::kFloat));
      stepTensor_ = at::full({}, static_cast<double>(s_.result.steps), onDevice.dtype(at::kDouble));
    }
    lrTensor_.fill_(s_.lr);
  }
  const bool fits = host.images.sizes() == staticImages_.sizes() && host.labels.sizes() == staticLabels_.sizes();
  if (!fits) {
    const data::Batch b = loader.toDevice(std::move(host));
    graph_.warmUp([&] { body(b.images, b.labels); });
    if (graph_.captured()) ++uncaptured_;
    return static_cast<int64_t>(batch.size());
  }
  {
    // On the current stream, before the step (the graph's stream waits for it): from page-locked
    // memory the host does not wait, and the allocator keeps that memory until the copy ran.
    c10::NoGradGuard noGrad;
    staticImages_.copy_(host.images, /*non_blocking=*/true);
    staticLabels_.copy_(host.labels, /*non_blocking=*/true);
  }
  if (warmups_ < kGraphWarmupSteps) {
    graph_.warmUp([&] { body(staticImages_, staticLabels_); });
    ++warmups_;
    return static_cast<int64_t>(batch.size());
  }
  if (!graph_.captured()) {
    {
      const SyncDebug::Paused paused(s_.syncDebug);  // capturing is set-up, once
      graph_.capture([&] { body(staticImages_, staticLabels_); });
    }
    if (s_.rank == 0) {
      s_.bar.clear();
      spdlog::info("train.cuda_graph: step {} captured after {} warm-up steps; replayed from here",
                   s_.result.steps + 1, kGraphWarmupSteps);
    }
  }
  graph_.replay();
  ++replays_;
  return static_cast<int64_t>(batch.size());
}

// One step as the graph holds it: nothing here reads the device on the host, the learning rate and
// the step number are device tensors, the optimizer skips a non-finite step in its kernel.
void GraphStep::body(const at::Tensor& images, const at::Tensor& labels) {
  s_.parallelism.zeroGrad(s_.params);
  {
    c10::NoGradGuard noGrad;
    s_.lossForLog.zero_();
  }
  at::Tensor loss;
  {
    // Autocast's cast cache would keep tensors of one replay for the next: off, as torch.cuda.graph asks.
    const bool cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    try {
      const Autocast mixed(s_.device.type(), s_.autocastDtype, /*enabled=*/s_.autocastDtype != at::kFloat);
      loss = lossOf(s_.parallelism.forward(images, /*lastMicroBatch=*/true), labels);
    } catch (...) {
      at::autocast::set_autocast_cache_enabled(cache);
      throw;
    }
    at::autocast::set_autocast_cache_enabled(cache);
  }
  {
    c10::NoGradGuard noGrad;
    s_.lossForLog.add_(loss.detach().reshape({1}));
  }
  loss.backward();
  c10::NoGradGuard noGrad;
  if (s_.config.train.clipGradNorm > 0) s_.gradNorm = clipGradNorm(s_.params, s_.config.train.clipGradNorm);
  const at::Tensor found = nonFiniteFlag(checkedForFiniteness(s_.params, s_.gradNorm));
  if (s_.fused != nullptr) s_.fused->fusedStep(at::Tensor(), found, lrTensor_);
  else fusedSgdStep(*sgd_, lrTensor_, found);
  stepTensor_.add_(1);
  s_.nonfinite.recordInGraph(found, stepTensor_);
}

void GraphStep::await() {
  if (!graph_.captured()) return;
  using Clock = std::chrono::steady_clock;
  const auto limit = std::chrono::duration<double>(s_.config.comm.timeoutS);
  const auto start = Clock::now();
  for (auto pause = std::chrono::microseconds(20); !graph_.finished();
       pause = std::min(pause * 2, std::chrono::microseconds(1000))) {
    if (Clock::now() - start > limit) {
      DDP_THROW(TimeoutError, "train.cuda_graph: the replay of step ", s_.result.steps, " on rank ", s_.rank, "/",
                world_, " did not finish within comm.timeout_s (", s_.config.comm.timeoutS,
                " s): a rank stopped answering inside the graph's all-reduces, or crashed");
    }
    std::this_thread::sleep_for(pause);
  }
}

void GraphStep::report() const {
  if (s_.rank != 0) return;
  spdlog::info("train.cuda_graph: {} step(s) replayed from the graph, {} warm-up step(s), {} uncaptured (a batch of "
               "another shape)", replays_, warmups_, uncaptured_);
}

}  // namespace ddp::worker
