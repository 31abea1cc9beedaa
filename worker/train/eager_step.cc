#include "worker/train/eager_step.h"

#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>

#include "ddp/autocast.h"
#include "ddp/clip_grad.h"
#include "ddp/fused_optim.h"
#include "worker/train/finite_check.h"
#include "worker/train/loss.h"

namespace ddp::worker {
namespace {

// The fp16 loss scale below which skipped steps mean the run has diverged: 2^-14, fp16's smallest
// normal number (from the default 2^16, 30 overflows in a row); gradients that overflow at such a
// scale are not finite at any.
constexpr double kMinLossScale = 1.0 / 16384;

}  // namespace

// The step's micro-batches: forward, loss, backward (the gradients averaged over the ranks by the
// last one's), clipping, then the optimizer step at the schedule's lr. Returns the samples this
// rank consumed.
int64_t EagerStep::run(const std::vector<std::vector<int64_t>>& batches, data::BatchLoader& loader,
                       const StepPlace& place) {
  Parallelism& parallelism = s_.parallelism;
  parallelism.zeroGrad(s_.params);
  int64_t stepRankSamples = 0;
  // join: this rank's shard may end before the step's slots do (by at most one batch).
  const std::size_t held =
      place.first < batches.size() ? std::min(place.count, batches.size() - place.first) : std::size_t{0};
  for (std::size_t m = 0; m < held; ++m) {
    const auto& batch = batches[place.first + m];
    if (s_.sampleLog != nullptr) s_.sampleLog->write(place.epoch, s_.result.steps + 1, batch);
    const data::Batch b = loader.next();  // batches[first + m], on device
    // From pinned memory (data.pin_memory) the copy does not wait for the device.
    const at::Tensor y = b.labels.to(at::TensorOptions().device(parallelism.lossDevice()), /*non_blocking=*/true);
    at::Tensor loss;
    {
      // The forward and the loss under autocast (train.precision); backward outside it, as in PyTorch.
      const Autocast mixed(s_.device.type(), s_.autocastDtype, /*enabled=*/s_.autocastDtype != at::kFloat);
      const at::Tensor output = parallelism.forward(b.images, /*lastMicroBatch=*/m + 1 == place.count);
      loss = lossOf(output, y);
    }
    {
      c10::NoGradGuard noGrad;
      // join: weighted by samples (the shards' last batches differ); padded: the micro-batches' mean.
      const double weight = s_.join ? static_cast<double>(batch.size()) : 1.0 / static_cast<double>(place.count);
      if (m > 0) s_.lossForLog.add_(loss.detach().reshape({1}), weight);
      else if (weight == 1.0) s_.lossForLog.copy_(loss.detach().reshape({1}));  // one kernel
      else s_.lossForLog.copy_(loss.detach().reshape({1})).mul_(weight);
    }
    stepRankSamples += static_cast<int64_t>(batch.size());
    if (place.count > 1) loss = loss / static_cast<double>(place.count);
    if (s_.scaler != nullptr) s_.scaler->scale(loss).backward();
    else loss.backward();
  }
  // The slots this rank has no batch for: the others' collectives, with zeros; the missing micro-
  // batches count as zero loss, as a joined rank's do in PyTorch's Join.
  if (held == 0) {
    c10::NoGradGuard noGrad;
    s_.lossForLog.zero_();
  }
  for (std::size_t m = held; m < place.count; ++m) parallelism.backwardWithoutBatch(m + 1 == place.count);
  if (s_.join && stepRankSamples > 0) {
    c10::NoGradGuard noGrad;
    s_.lossForLog.div_(static_cast<double>(stepRankSamples));
  }
  // fp16: the true gradients (and one found-inf flag for every rank) before the norm is taken.
  if (s_.scaler != nullptr) s_.scaler->unscale_(s_.optimizer);
  // The averaged gradients are equal on every rank, so are the norm and the clipping (sharded: the
  // global norm, one all-reduce).
  if (s_.config.train.clipGradNorm > 0) s_.gradNorm = parallelism.clipGradients(s_.params, s_.config.train.clipGradNorm);
  s_.lr = s_.schedule.apply(s_.optimizer, s_.result.steps);  // result.steps: this step's index
  if (s_.scaler != nullptr) scaledStep();
  else applyOrSkip(place.epoch);
  return stepRankSamples;
}

// fp16: torch.amp.GradScaler's step — an overflowed step is skipped and the scale backs off, the
// same on every rank (the flag was summed over the group). The skips are counted on the device (with
// ddp::FusedAdamW nothing here waits for a GPU) and read when logging (checkCounters).
void EagerStep::scaledStep() {
  s_.scaler->step(s_.optimizer);
  s_.scaler->update();
  c10::NoGradGuard noGrad;
  const at::Tensor found = s_.scaler->foundInf();
  if (!scalerSkips_.defined()) scalerSkips_ = at::zeros({2}, found.options());
  scalerSkips_[0].add_(found);              // skipped in all
  scalerSkips_[1].add_(found).mul_(found);  // skipped in a row
}

// Only overflows that drove the scale below kMinLossScale mean the gradients are not finite at any
// scale: the run has diverged.
void EagerStep::checkCounters() {
  if (!scalerSkips_.defined()) return;
  const at::Tensor counts = scalerSkips_.to(at::kCPU, at::kDouble);
  s_.result.skippedSteps = static_cast<int64_t>(counts[0].item<double>());
  const auto inARow = static_cast<int64_t>(counts[1].item<double>());
  if (inARow > 0 && s_.scaler->getScale() < kMinLossScale) {
    throwDiverged(s_.config, fmt::format("the gradients are NaN or infinite at every loss scale down to {:g} ({} fp16 "
                                         "steps skipped in a row up to step {})",
                                         s_.scaler->getScale(), inARow, s_.result.steps));
  }
}

// The all-reduced gradients are equal on every rank, so every rank decides alike; a NaN loss on
// any rank reaches them through backward and the all-reduce.
void EagerStep::applyOrSkip(int64_t epoch) {
  // On a GPU the check stays on the device, except where skipping a step needs the host (an
  // optimizer without a found-inf input, and train.skip_nonfinite_steps).
  const TrainConfig& train = s_.config.train;
  if (deviceChecks_ && (s_.fused != nullptr || !train.skipNonfiniteSteps)) {
    deviceCheckedStep();
    return;
  }
  const int64_t step = s_.result.steps + 1;
  if (s_.parallelism.allFiniteOnEveryRank(checkedForFiniteness(s_.params, s_.gradNorm))) {
    s_.optimizer.step();
    skippedInARow_ = 0;
  } else if (train.skipNonfiniteSteps && skippedInARow_ < kMaxSkippedInARow) {
    ++skippedInARow_;
    ++s_.result.skippedSteps;
    if (s_.rank == 0) {
      s_.bar.clear();
      spdlog::warn("step {} (epoch {}): {}; step skipped (train.skip_nonfinite_steps)", step, epoch + 1,
                   nonFiniteGradients(train.clipGradNorm));  // counted from 1, as the progress line counts
    }
  } else {
    throwDiverged(s_.config, nonFiniteGradients(train.clipGradNorm) + " at step " + std::to_string(step) + " (epoch " +
                                 std::to_string(epoch + 1) + ")" +
                                 (skippedInARow_ > 0 ? ", " + std::to_string(skippedInARow_ + 1) + " steps in a row"
                                                     : std::string()) +
                                 ", so it was not applied");
  }
}

// The step with the non-finite check on the device (one kernel, ddp::NonFiniteSteps): a fused
// optimizer (ddp::FusedSGD, ddp::FusedAdamW) skips a flagged step in its kernel; another one applies
// it (the run then stops at the next log step, with the step's number, before any checkpoint of it).
void EagerStep::deviceCheckedStep() {
  c10::NoGradGuard noGrad;
  at::Tensor found = s_.nonfinite.flagStep(checkedForFiniteness(s_.params, s_.gradNorm), s_.result.steps + 1);
  s_.parallelism.agreeOnFlag(found);
  if (s_.fused != nullptr) s_.fused->fusedStep(at::Tensor(), found, at::Tensor());
  else s_.optimizer.step();
}

}  // namespace ddp::worker
