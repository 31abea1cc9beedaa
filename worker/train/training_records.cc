// The training loop's records of each step (metrics.jsonl, TensorBoard, the log line, the bar),
// the validation loss, stragglers, the agreed stop request and the end of the run (evaluation,
// rank 0's export): the parts of TrainingRun after the step itself.
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>

#include "common/error.h"
#include "worker/train/finite_check.h"
#include "worker/train/stop_signal.h"
#include "worker/train/training_run.h"

namespace ddp::worker::loop {

ProgressPoint TrainingRun::progressAt(const StepPlace& place, double loss, double rate) const {
  const int64_t accumulate = train_.accumulateSteps;
  return ProgressPoint{result_.steps, jobSteps_, place.epoch, train_.epochs,
                       epochStepOffset_ + static_cast<int64_t>((place.first + place.count + accumulate - 1) / accumulate),
                       perEpoch_,
                       loss, rate, secondsSince(start_), runSteps_};
}

// metrics.jsonl, TensorBoard and the log line at logged steps; the live bar at every step.
void TrainingRun::record(const StepPlace& place, bool last) {
  const bool logStep = result_.steps % train_.logEvery == 0 || last || result_.steps == 1;
  const bool finalStep = last || (place.epoch + 1 == train_.epochs && place.epochEnded());
  if (logStep || finalStep) syncDebug_.pause();
  if (parallelism_.lossNeedsAverage() && (logStep || finalStep)) {
    // The gradient sync carries only gradients; the loss is averaged here (every rank logs alike),
    // weighted by each rank's samples in the step under join (a rank without any adds nothing).
    // The stop requests come along: [loss × weight, weight, stop].
    c10::NoGradGuard noGrad;
    const double weight = join_ ? static_cast<double>(stepRankSamples_) : 1.0;
    const at::TensorOptions o = state_->lossForLog.options();
    at::Tensor packed = at::cat({state_->lossForLog * weight, at::full({1}, weight, o),
                                 at::full({1}, stopSignal() != 0 ? 1.0 : 0.0, o)});
    group_.allReduce(packed);
    state_->lossForLog.copy_(packed.slice(0, 0, 1) / packed.slice(0, 1, 2).clamp_min(1));
    stopVotes_ = packed.slice(0, 2, 3);
  }
  if (logStep) {
    step_->await();
    group_.waitForCollectives();  // a peer that never joined is named here, not by a hung read
    nonfinite_.check(result_, deviceSkips_);
    step_->checkCounters();
    const double lossValue = state_->lossForLog.item<double>();
    const double window = secondsSince(windowStart_);
    const double rate = window > 0 ? windowSamples_ / window : 0.0;
    nlohmann::json record = {{"step", result_.steps}, {"epoch", place.epoch}, {"loss", lossValue},
                             {"samples", result_.samples}, {"samples_per_s", rate}, {"elapsed_s", secondsSince(start_)},
                             {"lr", state_->lr}};
    if (state_->gradNorm.defined()) record["grad_norm"] = state_->gradNorm.item<double>();
    if (scaler_) record["loss_scale"] = scaler_->getScale();
    if (lm_) lm_->addRates(record, rate);
    keepRecords();
    metrics_.write(record);
    shownLoss_ = lossValue;
    shownRate_ = rate;
    if (board_) board_->addTrainingStep(result_.steps, lossValue, rate, state_->lr);
    const std::string straggler = straggler_ ? stragglerNote(straggler_->measure()) : "";
    if (rank_ == 0) {
      bar_.clear();
      spdlog::info("{}{}{}{}", progressLine(progressAt(place, lossValue, rate)), parallelism_.progressNote(),
                   lm_ ? lm_->progressNote(rate) : "", straggler);
    }
    windowStart_ = Clock::now();
    windowSamples_ = 0;
    syncDebug_.resume();
  }
  if (lm_ && lm_->validationDue(result_.steps)) recordValidation();
  bar_.update(progressAt(place, shownLoss_, shownRate_));
}

// eval.interval: the language model's validation loss, in metrics.jsonl, TensorBoard and a line of
// rank 0's (the time it takes is not training time: the throughput window restarts after it).
// Streamed images: the bad ones every rank left out (data.skip_bad_images), for summary.json.
// Collective: every rank counts.
void TrainingRun::countSkippedImages() {
  ProcessGroup& group = parallelism_.group();
  at::Tensor count = at::tensor({data_.images->skipped->load()}, at::kLong).to(group.collectiveDevice());
  group.allReduce(count);
  result_.streamedImages = true;
  result_.skippedImages = count.cpu().item<int64_t>();
}

void TrainingRun::recordValidation() {
  const SyncDebug::Paused paused(syncDebug_);
  const auto start = Clock::now();
  result_.valLoss = lm_->validationLoss(state_->autocastDtype);
  lastValidationSeconds_ = secondsSince(start);
  validatedStep_ = result_.steps;
  result_.valLossStep = result_.steps;
  keepRecords();
  metrics_.write({{"step", result_.steps}, {"val_loss", result_.valLoss}});
  if (board_) board_->addScalar("val/loss", result_.valLoss, result_.steps);
  if (rank_ == 0) {
    bar_.clear();
    spdlog::info("step {}: validation loss {:.4f}", result_.steps, result_.valLoss);
  }
  windowStart_ = Clock::now();
  windowSamples_ = 0;
}

// A rank that arrives markedly last (the others' median wait in the gradient all-reduce is mostly
// its lateness, and at least 10 ms): counted for summary.json, and named on the progress line.
std::string TrainingRun::stragglerNote(const StragglerReport& report) {
  if (report.straggler < 0) return "";
  double othersWait = 0;
  for (int r = 0; r < world_; ++r) {
    if (r != report.straggler) othersWait = std::max(othersWait, report.medianWaitS[static_cast<size_t>(r)]);
  }
  if (report.skewS < 0.01 || report.skewS < 0.5 * othersWait) return "";
  ++result_.stragglerCounts[static_cast<size_t>(report.straggler)];
  if (report.skewS > result_.stragglerMaxSkewS) {
    result_.stragglerMaxSkewS = report.skewS;
    result_.stragglerMaxSkewRank = report.straggler;
  }
  const size_t last = static_cast<size_t>(report.straggler);
  return fmt::format(" | rank {} arrives last at the gradient all-reduce, {:.3f} s late (its median/p95 wait {:.3f}/{:.3f} s, "
                     "the others' up to {:.3f} s)",
                     report.straggler, report.skewS, report.medianWaitS[last], report.p95WaitS[last], othersWait);
}

// Preemption: every rank must stop after the same step, so a stop request (SIGTERM) is agreed on
// with a tiny all-reduce; on one, the position is saved.
bool TrainingRun::stopRequested(const TrainPosition& position) {
  if (world_ == 1) {
    if (stopSignal() == 0) return false;  // on the host: a one-rank GPU job does not wait for its device here
  } else if (stopVotes_.defined()) {  // this step's log all-reduce carried the requests
    const at::Tensor votes = std::exchange(stopVotes_, at::Tensor());
    const bool wasOn = syncDebug_.on();
    syncDebug_.pause();
    step_->await();
    group_.waitForCollectives();
    if (votes.item<double>() <= 0) {
      if (wasOn) syncDebug_.resume();  // on again for the steps to the next log step
      return false;
    }
  } else {
    syncDebug_.pause();
    const int64_t steps = std::max<int64_t>(1, result_.steps - lastStopCheckStep_);
    {
      c10::NoGradGuard noGrad;
      // Whole milliseconds: their sum is exact in any order, so every rank derives the same period.
      const double msPerStep = std::round(1000.0 * secondsSince(lastStopCheck_) / static_cast<double>(steps));
      stopFlag_.copy_(at::tensor({stopSignal() != 0 ? 1.0 : 0.0, msPerStep}, at::TensorOptions().dtype(at::kDouble)));
    }
    group_.allReduce(stopFlag_);
    step_->await();
    group_.waitForCollectives();
    const at::Tensor agreed = stopFlag_.cpu();
    // The next check about kStopReactionS ahead at the ranks' mean step time.
    const auto totalMs = static_cast<int64_t>(agreed[1].item<double>());
    const int64_t fit = totalMs > 0 ? static_cast<int64_t>(1000 * kStopReactionS) * world_ / totalMs : kStopCheckEvery;
    nextStopCheck_ = result_.steps + std::clamp<int64_t>(fit, 1, kStopCheckEvery);
    lastStopCheckStep_ = result_.steps;
    lastStopCheck_ = Clock::now();
    if (agreed[0].item<double>() <= 0) return false;
  }
  nonfinite_.check(result_, deviceSkips_);
  result_.stopSignal = stopSignal() != 0 ? stopSignal() : SIGTERM;
  result_.checkpointPath = checkpointer_.save(module_, *optimizer_, position, scaler_ ? &*scaler_ : nullptr);
  if (rank_ == 0) {
    bar_.clear();
    spdlog::warn("stopping after step {} on a signal; checkpoint {} (resume with resume=auto)", result_.steps,
                 result_.checkpointPath);
  }
  return true;
}

// After the last step: the final loss, evaluation, rank<r>_params.pt when asked, rank 0's export.
void TrainingRun::finish() {
  syncDebug_.pause();
  step_->await();
  group_.waitForCollectives();
  step_->report();
  nonfinite_.check(result_, deviceSkips_);
  // NaN (null in summary.json) when this process took no step: there is no last loss to report.
  result_.tookNoStep = runSamples_ == 0;
  result_.finalLoss = result_.tookNoStep ? std::nan("") : state_->lossForLog.item<double>();
  step_->checkCounters();
  if (scaler_ && rank_ == 0 && result_.skippedSteps * 10 > result_.steps) {
    // The scale grows as well as starting high: both keys are named (which one drove the scale up to
    // the overflows is not tracked, to keep the device unread).
    spdlog::warn("the fp16 loss scaler skipped {} of {} steps (the gradients overflowed): the scale starts at "
                 "train.loss_scale_init ({:g}) and doubles after train.loss_scale_growth_interval ({}) finite steps; "
                 "lower the first or raise the second", result_.skippedSteps, result_.steps,
                 train_.lossScale.initScale, train_.lossScale.growthInterval);
  }
  // Finite gradients can still overflow the weights (a huge train.lr) on the last step.
  if (!parallelism_.allFiniteOnEveryRank(params_)) {
    throwDiverged(config_, "the weights are no longer finite after step " + std::to_string(result_.steps) +
                               ", the last one, so nothing is exported");
  }
  if (config_.eval.enabled && lm_) {
    const auto evalStart = Clock::now();
    if (lm_->hasValidation() && validatedStep_ != result_.steps) recordValidation();
    // The final weights' validation loss: taken now, or at the last step by eval.interval (then
    // also inside train_seconds, as nanoGPT's estimate_loss is inside its loop).
    result_.evalSeconds = validatedStep_ == result_.steps ? lastValidationSeconds_ : secondsSince(evalStart);
  } else if (config_.eval.enabled) {
    const auto evalStart = Clock::now();
    const EvalCounts counts = [&] {
      // Evaluated in the precision it was trained in.
      const Autocast mixed(device_.type(), state_->autocastDtype, /*enabled=*/state_->autocastDtype != at::kFloat);
      return parallelism_.evaluate(data_.testSource());
    }();
    result_.evalSeconds = secondsSince(evalStart);
    result_.testCorrect = counts.correct;
    result_.testTotal = counts.total;
    result_.testAccuracy = counts.accuracy();
    if (board_) board_->addScalar("test/accuracy", result_.testAccuracy, result_.steps);
  }
  if (data_.images) countSkippedImages();
  keepRecords();  // the export and summary.json go where the records are
  const std::string& outDir = config_.output.dir;
  if (config_.output.dumpRankParams) {
    makeDirectories(outDir, "output.dir");
    saveStateDict(parallelism_.rankState(), outDir + "/rank" + std::to_string(rank_) + "_params.pt");
  }
  const StateDict exported = parallelism_.exportState(/*writer=*/rank_ == 0);  // collective when sharded
  if (rank_ == 0) {
    result_.exportPath = (std::filesystem::path(outDir) / config_.output.exportName).string();
    exportTrainedModel(config_, exported, result_.exportPath);
  }
}

}  // namespace ddp::worker::loop
