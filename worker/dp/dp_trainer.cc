#include "worker/dp/dp_trainer.h"

#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>

#include "common/error.h"
#include "sampler/batching.h"
#include "sampler/distributed_sampler.h"
#include "worker/atomic_file.h"
#include "worker/progress.h"
#include "worker/tensorboard/event_writer.h"
#include "worker/checkpoint/state_dict_loader.h"
#include "worker/data/gather_batch.h"
#include "worker/device.h"
#include "worker/dp/data_parallel.h"
#include "worker/dp/memory_stats.h"
#include "worker/finite_check.h"
#include "worker/metrics.h"
#include "worker/model_export.h"

namespace ddp::worker::dp {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string visibleDevicesNote() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return std::string("CUDA_VISIBLE_DEVICES=") + (visible ? visible : "<unset>");
}

}  // namespace

DpPlacement resolveDpPlacement(const WorkerConfig& config) {
  const auto& dp = config.dp;
  const int visibleGpus = visibleCudaDevices(config.device);
  const bool haveCuda = visibleGpus > 0;
  const bool useCuda = config.device == "cuda" || (config.device == "auto" && haveCuda);
  DpPlacement p;
  if (!useCuda) {
    if (!dp.deviceIds.empty()) {
      DDP_THROW(ConfigError, "config: 'dp.device_ids' names GPUs, but this dp run is on CPU (device: ",
                config.device, ", ", haveCuda ? "GPUs visible" : "no GPU visible",
                "); on CPU set dp.replicas instead");
    }
    p.devices.assign(static_cast<std::size_t>(dp.replicas), c10::Device(c10::kCPU));
    p.outputDevice = c10::Device(c10::kCPU);
    return p;
  }
  if (!haveCuda) {
    DDP_THROW(ConfigError, "config: device 'cuda' but no GPU is visible to this process (or LibTorch "
              "was built without CUDA); use device: cpu or auto");
  }
  const auto count = static_cast<int64_t>(visibleGpus);
  std::vector<int64_t> ids = dp.deviceIds;
  if (ids.empty()) {
    for (int64_t i = 0; i < count; ++i) ids.push_back(i);
  }
  std::set<int64_t> seen;
  for (auto id : ids) {
    if (id >= count) {
      DDP_THROW(ConfigError, "config: 'dp.device_ids' has GPU ", id, " but only ", count,
                " GPU(s) are visible (", visibleDevicesNote(), "); ids are logical, 0..", count - 1,
                ", counted after CUDA_VISIBLE_DEVICES, as in PyTorch");
    }
    if (!seen.insert(id).second) {
      DDP_THROW(ConfigError, "config: 'dp.device_ids' lists GPU ", id, " twice; each GPU holds one replica");
    }
    p.devices.emplace_back(c10::kCUDA, static_cast<c10::DeviceIndex>(id));
  }
  const int64_t out = dp.outputDevice < 0 ? ids.front() : dp.outputDevice;
  if (out >= count) {
    DDP_THROW(ConfigError, "config: 'dp.output_device' is GPU ", out, " but only ", count,
              " GPU(s) are visible (", visibleDevicesNote(), "); use a logical id 0..", count - 1,
              " or -1 for device_ids[0]");
  }
  p.outputDevice = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(out));
  return p;
}

DpTrainer::DpTrainer(const WorkerConfig& config, DpPlacement placement)
    : config_(config), placement_(std::move(placement)) {}

DpResult DpTrainer::run(const Datasets& data) {
  const auto& train = config_.train;
  const std::string outDir = config_.output.dir;
  makeDirectories(outDir);

  torch::manual_seed(config_.seed);
  auto model = makeModel(config_.model, data.input);
  auto& module = *model.ptr();
  if (!config_.init.modelPath.empty()) {
    checkpoint::loadModelFile(module, config_.init.modelPath);
    spdlog::info("initial weights from {}", config_.init.modelPath);
  }
  module.to(placement_.devices.front());  // DataParallel wants the master on device_ids[0]
  DataParallelOptions dpOptions;
  dpOptions.devices = placement_.devices;
  dpOptions.outputDevice = placement_.outputDevice;
  DataParallel dp(model, dpOptions);
  const auto params = module.parameters(/*recurse=*/true);
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(train.lr)
                                          .momentum(train.momentum)
                                          .weight_decay(train.weightDecay));

  // One process sees the whole data set: a DistributedSampler of one replica,
  // so the batches are the ones a single-process run (or DDP's union) sees.
  sampler::DistributedSamplerOptions samplerOptions;
  samplerOptions.numReplicas = 1;
  samplerOptions.rank = 0;
  samplerOptions.shuffle = train.shuffle;
  samplerOptions.seed = config_.seed;
  samplerOptions.dropLast = train.dropLast;
  sampler::DistributedSampler sampler(data.train.size(), samplerOptions);

  MetricsWriter metrics(outDir + "/metrics.jsonl");
  DpResult out;
  TrainResult& result = out.train;
  at::Tensor lastLoss;
  const auto start = Clock::now();
  auto windowStart = start;
  int64_t windowSamples = 0;
  bool done = false;
  int64_t skippedInARow = 0;
  const int64_t accumulate = std::max<int64_t>(1, train.accumulateSteps);
  const int64_t perEpoch = stepsPerEpoch((sampler.numSamples() + train.batchSize - 1) / train.batchSize, accumulate);
  const int64_t jobSteps = totalSteps(train.epochs, perEpoch, train.maxSteps);
  ProgressBar bar(progressBarWanted(), std::getenv("DDP_LAUNCH_PREFIXED") != nullptr);
  double shownLoss = 0;
  double shownRate = 0;
  std::unique_ptr<tensorboard::EventWriter> board;
  if (config_.output.tensorboard) board = std::make_unique<tensorboard::EventWriter>(config_.output.dir + "/tensorboard");
  for (int64_t epoch = 0; epoch < train.epochs && !done; ++epoch) {
    sampler.setEpoch(epoch);
    const auto batches = sampler::makeBatches(sampler.indices(), train.batchSize, /*dropLast=*/false);
    module.train();
    // Batches stay on the CPU (DataParallel scatters them), page-locked when the replicas are GPUs.
    data::LoaderOptions loading = loaderOptions(config_.data, placement_.devices.front(), config_.seed, epoch);
    loading.device = c10::Device(c10::kCPU);
    loading.pinOnCpu = placement_.devices.front().is_cuda();
    data::BatchLoader loader(data.train, batches, loading);
    for (std::size_t b = 0; b < batches.size(); b += static_cast<std::size_t>(accumulate)) {
      optimizer.zero_grad();
      int64_t stepSamples = 0;
      const std::size_t end = std::min(batches.size(), b + static_cast<std::size_t>(accumulate));
      for (std::size_t m = b; m < end; ++m) {
        const auto& batch = batches[m];
        const data::Batch samples = loader.next();  // batches[m]
        const at::Tensor x = samples.images;  // DataParallel scatters it
        const at::Tensor y = samples.labels.to(placement_.outputDevice);
        // One loss on the gathered outputs: the mean over the whole batch, as nn.DataParallel.
        at::Tensor loss = torch::nn::functional::cross_entropy(dp.forward(x), y);
        if (end - b > 1) loss = loss / static_cast<double>(end - b);
        loss.backward();
        lastLoss = loss.detach() * static_cast<double>(end - b);
        stepSamples += static_cast<int64_t>(batch.size());
      }
      // As in ddp mode: a NaN or infinite gradient never reaches the weights.
      if (allFinite(gradientsOf(params))) {
        optimizer.step();
        skippedInARow = 0;
      } else if (train.skipNonfiniteSteps && skippedInARow < kMaxSkippedInARow) {
        ++skippedInARow;
        bar.clear();
        spdlog::warn("step {} (epoch {}): a gradient is NaN or infinite; step skipped (train.skip_nonfinite_steps)",
                     result.steps + 1, epoch);
      } else {
        throwDiverged(config_, "a gradient is NaN or infinite at step " + std::to_string(result.steps + 1) +
                                   " (epoch " + std::to_string(epoch) + ")" +
                                   (skippedInARow > 0 ? ", " + std::to_string(skippedInARow + 1) + " steps in a row"
                                                      : std::string()) +
                                   ", so it was not applied");
      }

      ++result.steps;
      result.samples += stepSamples;
      windowSamples += stepSamples;
      const bool last = train.maxSteps > 0 && result.steps >= train.maxSteps;
      if (result.steps % train.logEvery == 0 || last || result.steps == 1) {
        const double lossValue = lastLoss.item<double>();
        const double window = secondsSince(windowStart);
        const double rate = window > 0 ? windowSamples / window : 0.0;
        metrics.write({{"step", result.steps}, {"epoch", epoch}, {"loss", lossValue},
                       {"samples", result.samples}, {"samples_per_s", rate},
                       {"elapsed_s", secondsSince(start)}});
        shownLoss = lossValue;
        shownRate = rate;
        if (board) board->addTrainingStep(result.steps, lossValue, rate, train.lr);
        bar.clear();
        spdlog::info("{} ({} replicas)",
                     progressLine(ProgressPoint{result.steps, jobSteps, epoch, train.epochs,
                                                static_cast<int64_t>(b / accumulate) + 1, perEpoch, lossValue, rate,
                                                secondsSince(start), result.steps}),
                     dp.lastReplicasUsed());
        windowStart = Clock::now();
        windowSamples = 0;
      }
      bar.update(ProgressPoint{result.steps, jobSteps, epoch, train.epochs, static_cast<int64_t>(b / accumulate) + 1,
                               perEpoch, shownLoss, shownRate, secondsSince(start), result.steps});
      if (last) {
        done = true;
        break;
      }
    }
  }
  bar.clear();
  result.trainSeconds = secondsSince(start);
  result.samplesPerSecond = result.trainSeconds > 0 ? result.samples / result.trainSeconds : 0;
  result.finalLoss = lastLoss.defined() ? lastLoss.item<double>() : 0.0;
  if (!allFinite(params)) {
    throwDiverged(config_, "the weights are no longer finite after step " + std::to_string(result.steps) +
                               ", the last one, so nothing is exported");
  }

  if (config_.eval.enabled) {
    const auto evalStart = std::chrono::steady_clock::now();
    c10::NoGradGuard noGrad;
    module.eval();
    const int64_t n = data.test.size();
    int64_t correct = 0;
    data::LoaderOptions loading = loaderOptions(config_.data, placement_.devices.front(), config_.seed, 0);
    loading.device = c10::Device(c10::kCPU);
    loading.pinOnCpu = placement_.devices.front().is_cuda();
    loading.augment = {};
    data::BatchLoader loader(data.test, data::contiguousBatches(0, n, config_.eval.batchSize), loading);
    for (std::size_t k = 0; k < loader.size(); ++k) {
      const data::Batch b = loader.next();
      const at::Tensor x = b.images;
      const at::Tensor y = b.labels.to(placement_.outputDevice);
      correct += dp.forward(x).argmax(1).eq(y).sum().item<int64_t>();
    }
    result.testCorrect = correct;
    result.testTotal = n;
    result.testAccuracy = n > 0 ? static_cast<double>(correct) / n : 0.0;
    if (board) board->addScalar("test/accuracy", result.testAccuracy, result.steps);
    result.evalSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - evalStart).count();
  }

  // The master is the plain model: its export has the same keys as a single or DDP run.
  const auto state = stateDict(module);
  if (config_.output.dumpRankParams) exportStateDict(state, outDir + "/rank0_params.pt");
  result.exportPath = (std::filesystem::path(outDir) / config_.output.exportName).string();
  exportTrainedModel(config_, state, result.exportPath);
  for (const auto& d : placement_.devices) {
    if (d.is_cuda()) out.peakAllocatedBytes.push_back(cudaPeakAllocatedBytes(d));
  }
  return out;
}

}  // namespace ddp::worker::dp
