#include "worker/train/training_loop.h"

#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "ddp/ddp.h"
#include "libddp/checkpoint/atomic_file.h"
#include "worker/train/finite_check.h"
#include "worker/train/metrics.h"
#include "libddp/checkpoint/model_export.h"
#include "worker/report/progress.h"
#include "worker/train/stop_signal.h"
#include "worker/report/tensorboard/event_writer.h"
#include "worker/train/training_checkpointer.h"

namespace ddp::worker {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Steps between the all-reduces that agree on a stop request (SIGTERM): the
// reaction time is this many steps, the cost one 4-byte collective per period.
constexpr int64_t kStopCheckEvery = 10;

// Keeps each .grad tensor (it may alias a reducer bucket); zeroes it in place.
void zeroGradients(const std::vector<at::Tensor>& params) {
  c10::NoGradGuard noGrad;
  for (const auto& p : params) {
    if (p.grad().defined()) p.grad().zero_();
  }
}

}  // namespace

TrainResult runTrainingLoop(const WorkerConfig& config, const Datasets& data, Parallelism& parallelism,
                            c10::Device device) {
  comm::Communicator& comm = parallelism.comm();
  const int rank = comm.rank();
  const int world = comm.size();
  const auto& train = config.train;
  const std::string outDir = config.output.dir;
  if (rank == 0) checkpoint::makeDirectories(outDir);

  auto& module = parallelism.module();
  const auto params = module.parameters(/*recurse=*/true);
  const int64_t accumulate = train.accumulateSteps;

  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(train.lr)
                                          .momentum(train.momentum)
                                          .weight_decay(train.weightDecay));

  DistributedSampler sampler(data.train.size(), world, rank, {train.shuffle, config.seed, train.dropLast});

  TrainingCheckpointer checkpointer(config, comm, device);
  const TrainPosition resumed = checkpointer.resume(module, optimizer);

  // A resumed run appends to the metrics of the run it continues.
  MetricsWriter metrics = rank == 0 ? MetricsWriter(outDir + "/metrics.jsonl", resumed.globalStep > 0)
                                    : MetricsWriter();
  TrainResult result;
  result.steps = resumed.globalStep;
  result.samples = resumed.samples;
  int64_t runSamples = 0;  // this process's share of the throughput figure
  at::Tensor stopFlag = at::zeros({1}, at::TensorOptions().device(comm.device()));
  at::Tensor lossForLog = at::zeros({1}, at::TensorOptions().device(parallelism.lossDevice()));
  const auto start = Clock::now();
  auto windowStart = start;
  int64_t windowSamples = 0;
  int64_t skippedInARow = 0;
  bool done = train.maxSteps > 0 && result.steps >= train.maxSteps;
  // Progress for people (rank 0): every epoch has the same number of batches (the sampler pads).
  const int64_t perEpoch = stepsPerEpoch((sampler.numSamples() + train.batchSize - 1) / train.batchSize, accumulate);
  const int64_t jobSteps = totalSteps(train.epochs, perEpoch, train.maxSteps);
  ProgressBar bar(rank == 0 && progressBarWanted(), std::getenv("DDP_LAUNCH_PREFIXED") != nullptr);
  double shownLoss = 0;
  double shownRate = 0;
  int64_t runSteps = 0;
  // output.tensorboard: the scalars torch.utils.tensorboard users log, from rank 0.
  std::unique_ptr<tensorboard::EventWriter> board;
  if (rank == 0 && config.output.tensorboard) board = std::make_unique<tensorboard::EventWriter>(outDir + "/tensorboard");
  for (int64_t epoch = resumed.epoch; epoch < train.epochs && !done; ++epoch) {
    sampler.setEpoch(epoch);
    const auto batches = sampler.batches(train.batchSize, /*dropLast=*/false);
    module.train();
    // A resumed epoch continues at the exact batch where the checkpoint was taken.
    const std::size_t startBatch =
        epoch == resumed.epoch ? static_cast<std::size_t>(resumed.stepInEpoch * accumulate) : 0;
    // The batches from there on, made ahead by the loader's threads (data.num_workers).
    data::BatchLoader loader(data.train,
                             std::vector<std::vector<int64_t>>(batches.begin() + static_cast<std::ptrdiff_t>(
                                                                                     std::min(startBatch, batches.size())),
                                                               batches.end()),
                             parallelism.loading(epoch, /*training=*/true));
    // An optimizer step takes `accumulate` micro-batches (fewer at the end of an epoch);
    // only the last one's backward communicates (DDP's no_sync for the others).
    for (std::size_t first = startBatch; first < batches.size(); first += accumulate) {
      const std::size_t count = std::min<std::size_t>(accumulate, batches.size() - first);
      zeroGradients(params);
      parallelism.beginStep();
      int64_t stepRankSamples = 0;
      {
        c10::NoGradGuard noGrad;
        lossForLog.zero_();
      }
      for (std::size_t m = 0; m < count; ++m) {
        const auto& batch = batches[first + m];
        const data::Batch b = loader.next();  // batches[first + m], on device
        const at::Tensor& x = b.images;
        const at::Tensor y = b.labels.to(parallelism.lossDevice());
        const at::Tensor output = parallelism.forward(x, /*lastMicroBatch=*/m + 1 == count);
        at::Tensor loss = torch::nn::functional::cross_entropy(output, y);
        {
          c10::NoGradGuard noGrad;
          lossForLog.add_(loss.detach().reshape({1}), 1.0 / static_cast<double>(count));
        }
        stepRankSamples += static_cast<int64_t>(batch.size());
        if (count > 1) loss = loss / static_cast<double>(count);
        loss.backward();
      }
      parallelism.endBackward(params, lossForLog);
      // The all-reduced gradients are equal on every rank, so every rank decides alike; a NaN
      // loss on any rank reaches them through backward and the all-reduce.
      if (allFinite(gradientsOf(params))) {
        optimizer.step();
        skippedInARow = 0;
      } else if (train.skipNonfiniteSteps && skippedInARow < kMaxSkippedInARow) {
        ++skippedInARow;
        if (rank == 0) {
          bar.clear();
          spdlog::warn("step {} (epoch {}): a gradient is NaN or infinite; step skipped (train.skip_nonfinite_steps)",
                       result.steps + 1, epoch);
        }
      } else {
        throwDiverged(config, "a gradient is NaN or infinite at step " + std::to_string(result.steps + 1) +
                                   " (epoch " + std::to_string(epoch) + ")" +
                                   (skippedInARow > 0 ? ", " + std::to_string(skippedInARow + 1) + " steps in a row"
                                                      : std::string()) +
                                   ", so it was not applied");
      }

      ++result.steps;
      ++runSteps;
      // Every rank's batch has the same size (the sampler pads), so this is exact.
      const int64_t stepSamples = stepRankSamples * world;
      result.samples += stepSamples;
      runSamples += stepSamples;
      windowSamples += stepSamples;
      const bool last = train.maxSteps > 0 && result.steps >= train.maxSteps;
      const bool logStep = result.steps % train.logEvery == 0 || last || result.steps == 1;
      const bool finalStep =
          last || (epoch + 1 == train.epochs && first + count >= batches.size());
      if (parallelism.lossNeedsAverage() && (logStep || finalStep)) {
        // The reducer carries only gradients; the loss is averaged here (every rank logs alike).
        comm.allReduceSum(lossForLog);
        c10::NoGradGuard noGrad;
        lossForLog.div_(world);
      }
      if (logStep) {
        const double lossValue = lossForLog.item<double>();
        const double window = secondsSince(windowStart);
        const double rate = window > 0 ? windowSamples / window : 0.0;
        metrics.write({{"step", result.steps}, {"epoch", epoch}, {"loss", lossValue},
                       {"samples", result.samples}, {"samples_per_s", rate},
                       {"elapsed_s", secondsSince(start)}});
        shownLoss = lossValue;
        shownRate = rate;
        if (board) board->addTrainingStep(result.steps, lossValue, rate, train.lr);
        if (rank == 0) {
          bar.clear();
          spdlog::info("{}{}", progressLine(ProgressPoint{result.steps, jobSteps, epoch, train.epochs,
                                                          static_cast<int64_t>((first + count + accumulate - 1) / accumulate),
                                                          perEpoch, lossValue, rate, secondsSince(start), runSteps}),
                       parallelism.progressNote());
        }
        windowStart = Clock::now();
        windowSamples = 0;
      }
      bar.update(ProgressPoint{result.steps, jobSteps, epoch, train.epochs,
                               static_cast<int64_t>((first + count + accumulate - 1) / accumulate), perEpoch, shownLoss,
                               shownRate, secondsSince(start), runSteps});
      const bool epochEnded = first + count >= batches.size();
      const TrainPosition position =
          epochEnded ? TrainPosition{epoch + 1, 0, result.steps, result.samples}
                     : TrainPosition{epoch, static_cast<int64_t>(first / accumulate) + 1, result.steps,
                                     result.samples};
      checkpointer.maybeSave(module, optimizer, position, epochEnded);

      // Preemption: every rank must stop after the same step, so the request is
      // agreed on with a tiny all-reduce every kStopCheckEvery steps.
      if (world == 1 || result.steps % kStopCheckEvery == 0 || epochEnded) {
        {
          c10::NoGradGuard noGrad;
          stopFlag.fill_(stopSignal() != 0 ? 1.0 : 0.0);
        }
        if (world > 1) comm.allReduceSum(stopFlag);
        if (stopFlag.item<double>() > 0) {
          result.checkpointPath = checkpointer.save(module, optimizer, position);
          result.stopSignal = stopSignal() != 0 ? stopSignal() : SIGTERM;
          if (rank == 0) {
            bar.clear();
            spdlog::warn("stopping after step {} on a signal; checkpoint {} (resume with resume=auto)",
                         result.steps, result.checkpointPath);
          }
          done = true;
          break;
        }
      }
      if (last) {
        done = true;
        break;
      }
    }
  }
  bar.clear();
  result.trainSeconds = secondsSince(start);
  result.samplesPerSecond = result.trainSeconds > 0 ? runSamples / result.trainSeconds : 0;
  if (result.stopSignal != 0) return result;  // preempted: the checkpoint is the record
  result.finalLoss = lossForLog.item<double>();
  // Finite gradients can still overflow the weights (a huge train.lr) on the last step.
  if (!allFinite(params)) {
    throwDiverged(config, "the weights are no longer finite after step " + std::to_string(result.steps) +
                               ", the last one, so nothing is exported");
  }

  if (config.eval.enabled) {
    const auto evalStart = Clock::now();
    const EvalCounts counts = parallelism.evaluate(data.test);
    result.evalSeconds = secondsSince(evalStart);
    result.testCorrect = counts.correct;
    result.testTotal = counts.total;
    result.testAccuracy = counts.accuracy();
    if (board) board->addScalar("test/accuracy", result.testAccuracy, result.steps);
  }

  if (config.output.dumpRankParams) {
    checkpoint::makeDirectories(outDir);
    checkpoint::exportStateDict(checkpoint::stateDict(module), outDir + "/rank" + std::to_string(rank) + "_params.pt");
  }
  if (rank == 0) {
    result.exportPath = (std::filesystem::path(outDir) / config.output.exportName).string();
    exportTrainedModel(config, checkpoint::stateDict(module), result.exportPath);
  }
  return result;
}

}  // namespace ddp::worker
