#include "worker/train/training_loop.h"

#include <ATen/autocast_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <thread>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <utility>

#include "common/error.h"
#include "ddp/ddp.h"
#include "ddp/cuda.h"
#include "ddp/files.h"
#include "worker/train/finite_check.h"
#include "worker/train/metrics.h"
#include "ddp/state_dict.h"
#include "worker/report/progress.h"
#include "worker/train/stop_signal.h"
#include "worker/report/tensorboard/event_writer.h"
#include "worker/train/training_checkpointer.h"

namespace ddp::worker {

void Parallelism::backwardWithoutBatch(bool) {
  DDP_THROW(Error, "train.uneven_inputs join: this mode has no ranks to join (it is for mode ddp)");
}

// Keeps each .grad tensor (it may alias a reducer bucket); zeroes it in place.
void Parallelism::zeroGrad(const std::vector<at::Tensor>& params) {
  c10::NoGradGuard noGrad;
  for (const auto& p : params) {
    if (p.grad().defined()) p.grad().zero_();
  }
}

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Steps between the all-reduces that agree on a stop request (SIGTERM): the
// reaction time is this many steps, the cost one 4-byte collective per period. On a GPU the
// request rides on the log steps' loss all-reduce instead (no host read between log steps).
constexpr int64_t kStopCheckEvery = 10;

// train.cuda_graph: eager steps on the graph's stream before the capture (lazy initialisations,
// the reducer's first backward, which turns the gradients into bucket views, the optimizer's state).
constexpr int64_t kGraphWarmupSteps = 3;

// cuda.sync_debug → torch.cuda.set_sync_debug_mode's level (0 off, 1 warn, 2 error).
int syncDebugLevel(const std::string& mode) { return mode == "error" ? 2 : mode == "warn" ? 1 : 0; }

// train.optimizer over `params`, with PyTorch's semantics for each option; with LibTorch's fused
// kernels (ddp::FusedAdamW, ddp::FusedSGD) when train.fused says so (auto: on a GPU).
std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const TrainConfig& t, const std::vector<at::Tensor>& params,
                                                       c10::Device device, const ProcessGroup& group) {
  if (t.zero && group.size() > 1) {  // train.zero: the same optimizer, its state sharded over the ranks
    if (t.optimizer == "adamw") {
      return std::make_unique<ZeroRedundancyOptimizer>(
          params, group, torch::optim::AdamWOptions(t.lr).betas({t.betas[0], t.betas[1]}).eps(t.eps).weight_decay(t.weightDecay));
    }
    if (t.optimizer == "adam") {
      return std::make_unique<ZeroRedundancyOptimizer>(
          params, group, torch::optim::AdamOptions(t.lr).betas({t.betas[0], t.betas[1]}).eps(t.eps).weight_decay(t.weightDecay));
    }
    return std::make_unique<ZeroRedundancyOptimizer>(
        params, group, torch::optim::SGDOptions(t.lr).momentum(t.momentum).weight_decay(t.weightDecay).nesterov(t.nesterov));
  }
  const bool adam = t.optimizer == "adamw" || t.optimizer == "adam";
  const bool fused = adam && (t.fused == "true" || (t.fused == "auto" && device.is_cuda() &&
                                                    FusedAdamW::available(device.type())));
  if (fused) {
    if (!FusedAdamW::available(device.type())) {
      DDP_THROW(ConfigError, "config: 'train.fused' is true but this LibTorch has no fused Adam kernel for ",
                device.str(), " (LibTorch 2.x has, on CUDA and CPU); use train.fused: auto");
    }
    FusedAdamWOptions o;
    o.lr = t.lr;
    o.beta1 = t.betas[0];
    o.beta2 = t.betas[1];
    o.eps = t.eps;
    o.weightDecay = t.weightDecay;
    o.decoupledWeightDecay = t.optimizer == "adamw";
    return std::make_unique<FusedAdamW>(params, o);
  }
  if (t.optimizer == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(t.lr).betas({t.betas[0], t.betas[1]}).eps(t.eps).weight_decay(t.weightDecay));
  }
  if (t.optimizer == "adam") {
    return std::make_unique<torch::optim::Adam>(
        params, torch::optim::AdamOptions(t.lr).betas({t.betas[0], t.betas[1]}).eps(t.eps).weight_decay(t.weightDecay));
  }
  const auto sgdOptions =
      torch::optim::SGDOptions(t.lr).momentum(t.momentum).weight_decay(t.weightDecay).nesterov(t.nesterov);
  // SGD as torch.optim.SGD(fused=True) (ddp::FusedSGD): one kernel for every parameter instead of a
  // few per parameter, a step the GPU's non-finite flag can skip in the kernel.
  if (t.fused == "true" || (t.fused == "auto" && device.is_cuda() && FusedSGD::available(device.type()))) {
    if (!FusedSGD::available(device.type())) {
      DDP_THROW(ConfigError, "config: 'train.fused' is true but this LibTorch has no fused SGD kernel for ",
                device.str(), " (LibTorch 2.x has, on CUDA and CPU); use train.fused: auto");
    }
    return std::make_unique<FusedSGD>(params, sgdOptions);
  }
  return std::make_unique<torch::optim::SGD>(params, sgdOptions);
}

// train.lr_schedule over train.decay_steps, else the job's `jobSteps`; a warm-up that would take
// the whole run is refused.
LrSchedule makeSchedule(const TrainConfig& t, int64_t jobSteps) {
  if (t.warmupSteps > 0 && t.warmupSteps >= jobSteps) {
    DDP_THROW(ConfigError, "config: 'train.warmup_steps' is ", t.warmupSteps, " but the run has ", jobSteps,
              " optimizer steps (train.epochs, the data and train.max_steps); use fewer warm-up steps");
  }
  const int64_t totalSteps = t.decaySteps > 0 ? t.decaySteps : jobSteps;
  if ((t.lrSchedule == LrDecay::kCosine || t.lrSchedule == LrDecay::kLinear) && t.warmupSteps >= totalSteps) {
    DDP_THROW(ConfigError, "config: 'train.warmup_steps' is ", t.warmupSteps, " but train.decay_steps is ",
              totalSteps, "; the decay must end after the warm-up");
  }
  LrScheduleOptions o;
  o.kind = t.lrSchedule;
  o.baseLr = t.lr;
  o.warmupSteps = t.warmupSteps;
  o.totalSteps = totalSteps;
  o.minLr = t.minLr;
  o.stepSize = std::max<int64_t>(1, t.stepSize);
  o.gamma = t.gamma;
  return LrSchedule(o);
}

// The fp16 loss scale below which skipped steps mean the run has diverged: 2^-14, fp16's smallest
// normal number (from the default 2^16, 30 overflows in a row); gradients that overflow at such a
// scale are not finite at any.
constexpr double kMinLossScale = 1.0 / 16384;

// train.precision → the autocast dtype (kFloat: none).
at::ScalarType autocastDtype(const std::string& precision) {
  if (precision == "bf16") return at::kBFloat16;
  if (precision == "fp16") return at::kHalf;
  return at::kFloat;
}

// One run of the loop: the state every step shares, and the steps as named methods.
class TrainingRun {
 public:
  TrainingRun(const WorkerConfig& config, const Datasets& data, Parallelism& parallelism, c10::Device device);
  TrainResult run();

 private:
  // Where the step that just finished sits in its epoch.
  struct StepPlace {
    int64_t epoch = 0;
    std::size_t first = 0;  // its first micro-batch
    std::size_t count = 0;  // its micro-batches
    std::size_t batches = 0;  // in the epoch
    bool epochEnded() const { return first + count >= batches; }
  };

  void runEpoch(int64_t epoch);
  int64_t accumulateAndStep(const std::vector<std::vector<int64_t>>& batches, data::BatchLoader& loader,
                            const StepPlace& place);
  void applyOrSkip(int64_t epoch);
  void deviceCheckedStep();
  int64_t graphStep(const std::vector<std::vector<int64_t>>& batches, data::BatchLoader& loader, const StepPlace& place);
  void graphBody(const at::Tensor& images, const at::Tensor& labels);
  void awaitGraph();
  void checkDeviceNonfinite();
  void pauseSyncDebug();
  void resumeSyncDebug();
  void scaledStep();
  void checkScalerSkips();
  void stopProfile();
  void record(const StepPlace& place, bool last);
  bool stopRequested(const TrainPosition& position);
  void finish();
  int64_t samplesOverRanks(const StepPlace& place) const;
  int64_t resumedStart() const;
  int64_t epochBatchesFrom(int64_t epoch, int64_t start);
  ProgressPoint progressAt(const StepPlace& place, double loss, double rate) const;

  const WorkerConfig& config_;
  const TrainConfig& train_;
  const Datasets& data_;
  Parallelism& parallelism_;
  ProcessGroup& group_;
  const int rank_;
  const int world_;
  torch::nn::Module& module_;
  const std::vector<at::Tensor> params_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<LrSchedule> schedule_;
  const c10::Device device_;
  const bool join_;  // train.uneven_inputs join (world > 1): unpadded shards, ranks without a batch join
  const at::ScalarType autocastDtype_;  // kFloat: fp32, no autocast
  std::optional<GradScaler> scaler_;    // train.precision: fp16
  at::Tensor scalerSkips_;              // fp16: steps the scaler skipped, in all and in a row (device)
  double lr_ = 0;          // the last step's
  at::Tensor gradNorm_;    // the last step's, before clipping (train.clip_grad_norm)
  DistributedSampler sampler_;
  TrainingCheckpointer checkpointer_;
  TrainPosition resumed_;
  MetricsWriter metrics_;
  std::ofstream sampleLog_;  // output.sample_log
  TrainResult result_;
  std::unique_ptr<tensorboard::EventWriter> board_;  // output.tensorboard: the scalars
                                                     // torch.utils.tensorboard users log, from rank 0
  at::Tensor stopFlag_;
  // On a GPU nothing between log steps reads the device: the non-finite check is a device flag,
  // read at log steps (and before a checkpoint), and (world > 1) the stop request rides on the log
  // steps' loss all-reduce.
  const bool deviceChecks_;
  FusedOptimizer* fused_ = nullptr;  // skips a flagged step inside its kernel
  NonFiniteSteps nonfiniteSteps_;    // GPU, eager: one flag per step, read at log steps
  at::Tensor nonfinite_;             // GPU, graph: [flagged steps, of them in a row, the first one's number]
  int64_t nonfiniteSeen_ = 0;        // graph: flagged steps already reported
  int64_t firstNonfinite_ = 0;       // the run's first flagged step (0: none yet)
  at::Tensor stopVotes_;         // the last log step's summed stop requests (device), or undefined
  int syncDebug_ = 0;            // cuda.sync_debug level, set between log steps
  bool syncDebugOn_ = false;
  // train.cuda_graph: the step captured once and replayed, over static inputs; the learning rate
  // and the step number live on the device.
  CudaGraph* graph_ = nullptr;        // the parallelism's
  torch::optim::SGD* sgd_ = nullptr;  // stepped by ddp::fusedSgdStep under graphs
  bool deviceSkips_ = false;          // the optimizer skips a flagged step on the device
  int64_t graphWarmups_ = 0;
  int64_t uncapturedSteps_ = 0;       // after the capture: steps whose batch did not fit the graph
  int64_t graphReplays_ = 0;
  at::Tensor staticImages_, staticLabels_, lrTensor_, stepTensor_;
  at::Tensor lossForLog_;
  std::optional<Profiler> profiler_;  // output.profile_start
  int64_t profiledFrom_ = 0;
  int64_t runSamples_ = 0;  // this process's share of the throughput figure
  int64_t runSteps_ = 0;
  int64_t windowSamples_ = 0;
  int64_t skippedInARow_ = 0;
  int64_t perEpoch_ = 0;           // optimizer steps in a whole epoch
  std::size_t epochBatches_ = 0;   // micro-batch slots in this epoch (from its start): rank 0's batches
                                   // (it holds the most)
  int64_t epochStart_ = 0;         // positions of this epoch's permutation consumed before this run
  int64_t epochStepOffset_ = 0;    // optimizer steps of this epoch taken before this run
  int64_t stepRankSamples_ = 0;   // this rank's samples in the last step (join: the logged loss's weight)
  int64_t jobSteps_ = 0;
  double shownLoss_ = 0;
  double shownRate_ = 0;
  bool done_ = false;
  Clock::time_point start_;
  Clock::time_point windowStart_;
  ProgressBar bar_;
};

TrainingRun::TrainingRun(const WorkerConfig& config, const Datasets& data, Parallelism& parallelism,
                         c10::Device device)
    : config_(config), train_(config.train), data_(data), parallelism_(parallelism), group_(parallelism.group()),
      rank_(group_.rank()), world_(group_.size()), module_(parallelism.module()),
      params_(module_.parameters(/*recurse=*/true)),
      optimizer_(makeOptimizer(train_, params_, device, group_)), device_(device),
      join_(train_.unevenInputs == "join" && world_ > 1), autocastDtype_(autocastDtype(train_.precision)),
      sampler_(data.train.size(), world_, rank_, {train_.shuffle, config.seed, train_.dropLast, /*pad=*/!join_}),
      checkpointer_(config, group_, parallelism.cudaGenerators()), deviceChecks_(device.is_cuda()),
      syncDebug_(syncDebugLevel(config.cuda.syncDebug)),
      bar_(rank_ == 0 && progressBarWanted(), std::getenv("DDP_LAUNCH_PREFIXED") != nullptr) {
  if (rank_ == 0) makeDirectories(config_.output.dir, "output.dir");
  if (autocastDtype_ != at::kFloat && !Autocast::supports(device_.type(), autocastDtype_)) {
    DDP_THROW(ConfigError, "config: 'train.precision' is ", train_.precision, " but this LibTorch cannot autocast ",
              device_.str(), " to it; use bf16 on a CPU (fp16 needs LibTorch 2.x there) or fp32");
  }
  // fp16 needs a loss scale; its found-inf flag is agreed on by every rank of the group.
  if (train_.precision == "fp16") {
    GradScalerOptions options;
    options.initScale = train_.lossScaleInit;
    options.growthInterval = train_.lossScaleGrowthInterval;
    scaler_.emplace(group_, options);
  }
  if (train_.precision == "fp16" && device_.is_cpu() && rank_ == 0) {
    spdlog::warn("train.precision fp16 on a CPU: LibTorch's CPU float16 kernels are slow (tens of times slower "
                 "than fp32 for the CNN); bf16 is the CPU's mixed precision");
  }
  if (syncDebug_ > 0 && !device_.is_cuda()) {
    DDP_THROW(ConfigError, "config: 'cuda.sync_debug' is ", config.cuda.syncDebug, " but this rank trains on ",
              device_.str(), "; it checks GPU runs (device cuda), use off here");
  }
  fused_ = dynamic_cast<FusedOptimizer*>(optimizer_.get());
  deviceSkips_ = fused_ != nullptr;
  if (train_.cudaGraph) {
    if (!device_.is_cuda()) {
      DDP_THROW(ConfigError, "config: 'train.cuda_graph' is true but this rank trains on ", device_.str(),
                "; CUDA graphs need a GPU (device cuda), set it false here");
    }
    if (world_ > 1 && group_.backend() != Backend::kNccl) {
      DDP_THROW(ConfigError, "config: 'train.cuda_graph' is true but the backend is ", backendName(group_.backend()),
                ", whose collectives on GPU tensors go through the host; use backend nccl");
    }
    sgd_ = dynamic_cast<torch::optim::SGD*>(optimizer_.get());
    if (fused_ == nullptr && (sgd_ == nullptr || !fusedSgdAvailable())) {
      DDP_THROW(ConfigError, "config: 'train.cuda_graph' steps SGD (LibTorch 2.x) or fused Adam/AdamW; "
                "this optimizer cannot be captured");
    }
    deviceSkips_ = true;
    graph_ = parallelism_.cudaGraph();
    if (graph_ == nullptr) DDP_THROW(ConfigError, "config: 'train.cuda_graph' is not available in this mode");
  }
  resumed_ = checkpointer_.resume(module_, *optimizer_, scaler_ ? &*scaler_ : nullptr);
  // A resumed run appends to the metrics of the run it continues.
  if (rank_ == 0) metrics_ = MetricsWriter(config_.output.dir + "/metrics.jsonl", resumed_.globalStep > 0);
  result_.steps = resumed_.globalStep;
  result_.samples = resumed_.samples;
  stopFlag_ = at::zeros({1}, at::TensorOptions().device(group_.collectiveDevice()));
  lossForLog_ = at::zeros({1}, at::TensorOptions().device(parallelism.lossDevice()));
  done_ = train_.maxSteps > 0 && result_.steps >= train_.maxSteps;
  // Every rank takes as many steps per epoch: the sampler pads, or (join) the ranks short of a batch
  // join the others' steps; rank 0's shard is the largest.
  perEpoch_ = stepsPerEpoch(epochBatchesFrom(0, 0), train_.accumulateSteps);
  jobSteps_ = totalSteps(train_.epochs, perEpoch_, train_.maxSteps);
  if (result_.steps > 0 && resumed_.epoch < train_.epochs) {
    // Resumed: the steps taken, the rest of the interrupted epoch at this world size, whole epochs
    // after it (the same total as an uninterrupted run when the world size did not change).
    const int64_t left = stepsPerEpoch(epochBatchesFrom(resumed_.epoch, resumedStart()), train_.accumulateSteps);
    const int64_t all = result_.steps + left + perEpoch_ * (train_.epochs - resumed_.epoch - 1);
    jobSteps_ = train_.maxSteps > 0 ? std::min(all, train_.maxSteps) : all;
  }
  schedule_.emplace(makeSchedule(train_, jobSteps_));
  lr_ = schedule_->at(result_.steps);
  if (config_.output.sampleLog) {
    makeDirectories(config_.output.dir, "output.dir");
    const std::string path = config_.output.dir + "/samples_rank" + std::to_string(rank_) + ".txt";
    sampleLog_.open(path, std::ios::app);
    if (!sampleLog_) DDP_THROW(ConfigError, "config: 'output.sample_log': cannot write '", path, "'; fix output.dir");
    // Which run the lines below come from: a restart redoes the steps after its checkpoint.
    const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
    sampleLog_ << "# restart " << (restart != nullptr && *restart != '\0' ? restart : "0") << " world " << world_
               << '\n' << std::flush;
  }
  if (rank_ == 0 && config_.output.tensorboard) {
    board_ = std::make_unique<tensorboard::EventWriter>(config_.output.dir + "/tensorboard");
  }
  if (config_.output.profileStart > 0) {
    if (!Profiler::available()) {
      DDP_THROW(ConfigError, "config: 'output.profile_start' needs LibTorch 2.x (1.13's C++ profiler API differs); "
                "set it 0, or profile with perf");
    }
    profiler_.emplace(ProfilerOptions{/*cuda=*/device_.is_cuda()});
  }
}

TrainResult TrainingRun::run() {
  start_ = Clock::now();
  windowStart_ = start_;
  for (int64_t epoch = resumed_.epoch; epoch < train_.epochs && !done_; ++epoch) runEpoch(epoch);
  pauseSyncDebug();
  if (profiler_ && profiler_->running()) stopProfile();  // the run ended inside the profiled steps
  bar_.clear();
  result_.trainSeconds = secondsSince(start_);
  result_.samplesPerSecond = result_.trainSeconds > 0 ? runSamples_ / result_.trainSeconds : 0;
  parallelism_.describe(result_);
  result_.optimizerStateBytes = std::max<int64_t>(0, optimizerStateBytes(*optimizer_));
  if (result_.stopSignal != 0) return result_;  // preempted: the checkpoint is the record
  finish();
  return result_;
}

void TrainingRun::runEpoch(int64_t epoch) {
  const int64_t accumulate = train_.accumulateSteps;
  // A resumed epoch continues after the samples of its permutation already seen, at any world size
  // (at the same one, exactly where the interrupted run's shards were).
  epochStart_ = epoch == resumed_.epoch ? resumedStart() : 0;
  epochStepOffset_ = epoch == resumed_.epoch && epochStart_ > 0 ? resumed_.stepInEpoch : 0;
  epochBatches_ = static_cast<std::size_t>(epochBatchesFrom(epoch, epochStart_));
  const auto batches = sampler_.batches(train_.batchSize, /*dropLast=*/false);
  module_.train();
  // Made ahead by the loader's threads (data.num_workers).
  data::BatchLoader loader(data_.train, batches, parallelism_.loading(epoch, /*training=*/true));
  // An optimizer step takes `accumulate` micro-batches (fewer at the end of an epoch);
  // only the last one's backward communicates (DDP's no_sync for the others).
  for (std::size_t first = 0; first < epochBatches_; first += accumulate) {
    const StepPlace place{epoch, first, std::min<std::size_t>(accumulate, epochBatches_ - first), epochBatches_};
    if (profiler_ && !profiler_->running() && result_.steps + 1 == config_.output.profileStart) {
      profiler_->start();
      profiledFrom_ = result_.steps + 1;
    }
    {
      // output.profile_start: the step as one "ProfilerStep#N" span, as torch.profiler marks them.
      const auto span = profiler_ && profiler_->running() ? profiler_->step() : nullptr;
      stepRankSamples_ = accumulateAndStep(batches, loader, place);
    }
    ++result_.steps;
    ++runSteps_;
    // Padded, every rank's batch has the same size; join: every rank knows every rank's share.
    const int64_t stepSamples = join_ ? samplesOverRanks(place) : stepRankSamples_ * world_;
    result_.samples += stepSamples;
    runSamples_ += stepSamples;
    windowSamples_ += stepSamples;
    const bool last = train_.maxSteps > 0 && result_.steps >= train_.maxSteps;
    record(place, last);
    if (profiler_ && profiler_->running() && result_.steps + 1 >= profiledFrom_ + config_.output.profileSteps) {
      stopProfile();
    }
    // Every rank consumed the same count of its positions (join: or all of them), so the epoch's
    // consumed positions are the first epochStart_ + world × batches × batch_size.
    const int64_t consumed = std::min<int64_t>(
        data_.train.size(), epochStart_ + static_cast<int64_t>(world_) * static_cast<int64_t>(first + place.count) *
                                               train_.batchSize);
    const TrainPosition position =
        place.epochEnded() ? TrainPosition{epoch + 1, 0, result_.steps, result_.samples, 0}
                           : TrainPosition{epoch, epochStepOffset_ + static_cast<int64_t>(first / accumulate) + 1,
                                           result_.steps, result_.samples, consumed};
    if (checkpointer_.due(position, place.epochEnded())) {
      // Never a checkpoint of weights a non-finite step reached.
      const bool debugging = syncDebugOn_;
      pauseSyncDebug();
      awaitGraph();
      group_.waitForCollectives();
      checkDeviceNonfinite();
      checkpointer_.save(module_, *optimizer_, position, scaler_ ? &*scaler_ : nullptr);
      if (debugging) resumeSyncDebug();
    }
    // GPU, world > 1: at log steps only, where the request came with the loss (stopVotes_).
    const bool stopCheck = world_ == 1 || stopVotes_.defined() ||
                           (!deviceChecks_ && (result_.steps % kStopCheckEvery == 0 || place.epochEnded()));
    if ((stopCheck && stopRequested(position)) || last) {
      done_ = true;
      return;
    }
  }
  pauseSyncDebug();  // a new epoch's loader starts its threads and pinned buffers
}

// The step's micro-batches: forward, loss, backward (the gradients averaged over the ranks by the
// last one's), clipping, then the optimizer step at the schedule's lr. Returns the samples this
// rank consumed.
int64_t TrainingRun::accumulateAndStep(const std::vector<std::vector<int64_t>>& batches, data::BatchLoader& loader,
                                       const StepPlace& place) {
  if (graph_) return graphStep(batches, loader, place);
  parallelism_.zeroGrad(params_);
  int64_t stepRankSamples = 0;
  // join: this rank's shard may end before the step's slots do (by at most one batch).
  const std::size_t held =
      place.first < batches.size() ? std::min(place.count, batches.size() - place.first) : std::size_t{0};
  for (std::size_t m = 0; m < held; ++m) {
    const auto& batch = batches[place.first + m];
    if (sampleLog_.is_open()) {
      sampleLog_ << place.epoch << ' ' << result_.steps + 1;
      for (int64_t i : batch) sampleLog_ << ' ' << i;
      sampleLog_ << '\n' << std::flush;
    }
    const data::Batch b = loader.next();  // batches[first + m], on device
    // From pinned memory (data.pin_memory) the copy does not wait for the device.
    const at::Tensor y = b.labels.to(at::TensorOptions().device(parallelism_.lossDevice()), /*non_blocking=*/true);
    at::Tensor loss;
    {
      // The forward and the loss under autocast (train.precision); backward outside it, as in PyTorch.
      const Autocast mixed(device_.type(), autocastDtype_, /*enabled=*/autocastDtype_ != at::kFloat);
      const at::Tensor output = parallelism_.forward(b.images, /*lastMicroBatch=*/m + 1 == place.count);
      loss = torch::nn::functional::cross_entropy(output, y);
    }
    {
      c10::NoGradGuard noGrad;
      // join: weighted by samples (the shards' last batches differ); padded: the micro-batches' mean.
      const double weight = join_ ? static_cast<double>(batch.size()) : 1.0 / static_cast<double>(place.count);
      if (m > 0) lossForLog_.add_(loss.detach().reshape({1}), weight);
      else if (weight == 1.0) lossForLog_.copy_(loss.detach().reshape({1}));  // one kernel
      else lossForLog_.copy_(loss.detach().reshape({1})).mul_(weight);
    }
    stepRankSamples += static_cast<int64_t>(batch.size());
    if (place.count > 1) loss = loss / static_cast<double>(place.count);
    if (scaler_) scaler_->scale(loss).backward();
    else loss.backward();
  }
  // The slots this rank has no batch for: the others' collectives, with zeros; the missing micro-
  // batches count as zero loss, as a joined rank's do in PyTorch's Join.
  if (held == 0) {
    c10::NoGradGuard noGrad;
    lossForLog_.zero_();
  }
  for (std::size_t m = held; m < place.count; ++m) parallelism_.backwardWithoutBatch(m + 1 == place.count);
  if (join_ && stepRankSamples > 0) {
    c10::NoGradGuard noGrad;
    lossForLog_.div_(static_cast<double>(stepRankSamples));
  }
  // fp16: the true gradients (and one found-inf flag for every rank) before the norm is taken.
  if (scaler_) scaler_->unscale_(*optimizer_);
  // The averaged gradients are equal on every rank, so are the norm and the clipping.
  if (train_.clipGradNorm > 0) gradNorm_ = clipGradNorm(params_, train_.clipGradNorm);
  lr_ = schedule_->apply(*optimizer_, result_.steps);  // result_.steps: this step's index
  if (scaler_) scaledStep();
  else applyOrSkip(place.epoch);
  return stepRankSamples;
}

// fp16: torch.amp.GradScaler's step — an overflowed step is skipped and the scale backs off, the
// same on every rank (the flag was summed over the group). The skips are counted on the device (with
// ddp::FusedAdamW nothing here waits for a GPU) and read when logging (checkScalerSkips).
void TrainingRun::scaledStep() {
  scaler_->step(*optimizer_);
  scaler_->update();
  c10::NoGradGuard noGrad;
  const at::Tensor found = scaler_->foundInf();
  if (!scalerSkips_.defined()) scalerSkips_ = at::zeros({2}, found.options());
  scalerSkips_[0].add_(found);            // skipped in all
  scalerSkips_[1].add_(found).mul_(found);  // skipped in a row
}

// Only overflows that drove the scale below kMinLossScale mean the gradients are not finite at any
// scale: the run has diverged.
void TrainingRun::checkScalerSkips() {
  if (!scalerSkips_.defined()) return;
  const at::Tensor counts = scalerSkips_.to(at::kCPU, at::kDouble);
  result_.skippedSteps = static_cast<int64_t>(counts[0].item<double>());
  const auto inARow = static_cast<int64_t>(counts[1].item<double>());
  if (inARow > 0 && scaler_->getScale() < kMinLossScale) {
    throwDiverged(config_, fmt::format("the gradients are NaN or infinite at every loss scale down to {:g} ({} fp16 "
                                       "steps skipped in a row up to step {})",
                                       scaler_->getScale(), inARow, result_.steps));
  }
}

// The all-reduced gradients are equal on every rank, so every rank decides alike; a NaN loss on
// any rank reaches them through backward and the all-reduce.
void TrainingRun::applyOrSkip(int64_t epoch) {
  // On a GPU the check stays on the device, except where skipping a step needs the host (an
  // optimizer without a found-inf input, and train.skip_nonfinite_steps).
  if (deviceChecks_ && (fused_ != nullptr || !train_.skipNonfiniteSteps)) {
    deviceCheckedStep();
    return;
  }
  if (allFinite(gradientsOf(params_))) {
    optimizer_->step();
    skippedInARow_ = 0;
  } else if (train_.skipNonfiniteSteps && skippedInARow_ < kMaxSkippedInARow) {
    ++skippedInARow_;
    ++result_.skippedSteps;
    if (rank_ == 0) {
      bar_.clear();
      spdlog::warn("step {} (epoch {}): a gradient is NaN or infinite; step skipped (train.skip_nonfinite_steps)",
                   result_.steps + 1, epoch);
    }
  } else {
    throwDiverged(config_, "a gradient is NaN or infinite at step " + std::to_string(result_.steps + 1) + " (epoch " +
                               std::to_string(epoch) + ")" +
                               (skippedInARow_ > 0 ? ", " + std::to_string(skippedInARow_ + 1) + " steps in a row"
                                                   : std::string()) +
                               ", so it was not applied");
  }
}

// The step with the non-finite check on the device (one kernel, ddp::NonFiniteSteps): a fused
// optimizer (ddp::FusedSGD, ddp::FusedAdamW) skips a flagged step in its kernel; another one applies
// it (the run then stops at the next log step, with the step's number, before any checkpoint of it).
// Read by checkDeviceNonfinite().
void TrainingRun::deviceCheckedStep() {
  c10::NoGradGuard noGrad;
  const at::Tensor found = nonfiniteSteps_.check(gradientsOf(params_), result_.steps + 1);
  if (fused_ != nullptr) fused_->fusedStep(at::Tensor(), found, at::Tensor());
  else optimizer_->step();
}

// train.cuda_graph: the step's batch is copied into the static inputs, then the step runs on the
// graph's stream: eagerly for the first kGraphWarmupSteps, then captured once and replayed. A batch of
// another shape (the last, partial one) runs its step uncaptured, on the same tensors.
int64_t TrainingRun::graphStep(const std::vector<std::vector<int64_t>>& batches, data::BatchLoader& loader,
                               const StepPlace& place) {
  const auto& batch = batches[place.first];  // accumulate_steps 1 and padded shards: every rank has one
  if (sampleLog_.is_open()) {
    sampleLog_ << place.epoch << ' ' << result_.steps + 1;
    for (int64_t i : batch) sampleLog_ << ' ' << i;
    sampleLog_ << '\n' << std::flush;
  }
  // The batch as the loader made it on the host (page-locked with data.pin_memory): copied straight
  // into the static inputs, or (another shape) to the device for an uncaptured step.
  data::Batch host = loader.nextOnHost();
  lr_ = schedule_->apply(*optimizer_, result_.steps);
  {
    c10::NoGradGuard noGrad;
    if (!staticImages_.defined()) {
      const at::TensorOptions onDevice = at::TensorOptions().device(device_);
      staticImages_ = at::empty(host.images.sizes(), onDevice.dtype(host.images.scalar_type()));
      staticLabels_ = at::empty(host.labels.sizes(), onDevice.dtype(host.labels.scalar_type()));
      lrTensor_ = at::zeros({}, onDevice.dtype(at::kFloat));
      stepTensor_ = at::full({}, static_cast<double>(result_.steps), onDevice.dtype(at::kDouble));
    }
    lrTensor_.fill_(lr_);
  }
  const bool fits = host.images.sizes() == staticImages_.sizes() && host.labels.sizes() == staticLabels_.sizes();
  if (!fits) {
    const data::Batch b = loader.toDevice(std::move(host));
    graph_->warmUp([&] { graphBody(b.images, b.labels); });
    if (graph_->captured()) ++uncapturedSteps_;
    return static_cast<int64_t>(batch.size());
  }
  {
    // On the current stream, before the step (the graph's stream waits for it): from page-locked
    // memory the host does not wait, and the allocator keeps that memory until the copy ran.
    c10::NoGradGuard noGrad;
    staticImages_.copy_(host.images, /*non_blocking=*/true);
    staticLabels_.copy_(host.labels, /*non_blocking=*/true);
  }
  if (graphWarmups_ < kGraphWarmupSteps) {
    graph_->warmUp([&] { graphBody(staticImages_, staticLabels_); });
    ++graphWarmups_;
    return static_cast<int64_t>(batch.size());
  }
  if (!graph_->captured()) {
    const bool debugging = syncDebugOn_;
    pauseSyncDebug();  // capturing is set-up, once
    graph_->capture([&] { graphBody(staticImages_, staticLabels_); });
    if (debugging) resumeSyncDebug();
    if (rank_ == 0) {
      bar_.clear();
      spdlog::info("train.cuda_graph: step {} captured after {} warm-up steps; replayed from here", result_.steps + 1,
                   kGraphWarmupSteps);
    }
  }
  graph_->replay();
  ++graphReplays_;
  return static_cast<int64_t>(batch.size());
}

// One step as the graph holds it: nothing here reads the device on the host, the learning rate and
// the step number are device tensors, the optimizer skips a non-finite step in its kernel.
void TrainingRun::graphBody(const at::Tensor& images, const at::Tensor& labels) {
  parallelism_.zeroGrad(params_);
  {
    c10::NoGradGuard noGrad;
    lossForLog_.zero_();
  }
  at::Tensor loss;
  {
    // Autocast's cast cache would keep tensors of one replay for the next: off, as torch.cuda.graph asks.
    const bool cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    try {
      const Autocast mixed(device_.type(), autocastDtype_, /*enabled=*/autocastDtype_ != at::kFloat);
      loss = torch::nn::functional::cross_entropy(parallelism_.forward(images, /*lastMicroBatch=*/true), labels);
    } catch (...) {
      at::autocast::set_autocast_cache_enabled(cache);
      throw;
    }
    at::autocast::set_autocast_cache_enabled(cache);
  }
  {
    c10::NoGradGuard noGrad;
    lossForLog_.add_(loss.detach().reshape({1}));
  }
  loss.backward();
  c10::NoGradGuard noGrad;
  if (train_.clipGradNorm > 0) gradNorm_ = clipGradNorm(params_, train_.clipGradNorm);
  const at::Tensor found = nonFiniteFlag(gradientsOf(params_));
  if (fused_ != nullptr) fused_->fusedStep(at::Tensor(), found, lrTensor_);
  else fusedSgdStep(*sgd_, lrTensor_, found);
  stepTensor_.add_(1);
  if (!nonfinite_.defined()) nonfinite_ = at::zeros({3}, found.options().dtype(at::kDouble));
  at::Tensor flagged = nonfinite_.select(0, 0);
  nonfinite_.select(0, 2).add_(flagged.eq(0).to(at::kDouble).mul_(found).mul_(stepTensor_));
  flagged.add_(found);
  nonfinite_.select(0, 1).add_(found).mul_(found);
}

// Replayed collectives are not ProcessGroupNCCL's works (its watchdog does not see them): the host
// waits for the last replay with the group's timeout before it reads a result.
void TrainingRun::awaitGraph() {
  if (!graph_ || !graph_->captured()) return;
  const auto limit = std::chrono::duration<double>(config_.comm.timeoutS);
  const auto start = Clock::now();
  for (auto pause = std::chrono::microseconds(20); !graph_->finished();
       pause = std::min(pause * 2, std::chrono::microseconds(1000))) {
    if (Clock::now() - start > limit) {
      DDP_THROW(TimeoutError, "train.cuda_graph: the replay of step ", result_.steps, " on rank ", rank_, "/", world_,
                " did not finish within comm.timeout_s (", config_.comm.timeoutS,
                " s): a rank stopped answering inside the graph's all-reduces, or crashed");
    }
    std::this_thread::sleep_for(pause);
  }
}

// Reads the device's non-finite counts (after waitForCollectives): a flagged step fails the run
// unless the fused optimizer skipped it and train.skip_nonfinite_steps allows skipping.
void TrainingRun::checkDeviceNonfinite() {
  int64_t newlyFlagged = 0;
  int64_t inARow = 0;
  if (nonfiniteSteps_.pending() > 0) {  // eager steps
    const NonFiniteSteps::Report report = nonfiniteSteps_.read();
    newlyFlagged = report.flagged;
    inARow = report.inARow;
    if (firstNonfinite_ == 0) firstNonfinite_ = report.first;
  } else if (nonfinite_.defined()) {  // graph steps
    const at::Tensor counts = nonfinite_.to(at::kCPU);
    const auto flagged = static_cast<int64_t>(counts[0].item<double>());
    newlyFlagged = flagged - nonfiniteSeen_;
    nonfiniteSeen_ = flagged;
    inARow = static_cast<int64_t>(counts[1].item<double>());
    firstNonfinite_ = static_cast<int64_t>(counts[2].item<double>());
  }
  if (newlyFlagged == 0) return;
  const int64_t first = firstNonfinite_;
  if (!deviceSkips_ || !train_.skipNonfiniteSteps || inARow >= kMaxSkippedInARow) {
    throwDiverged(config_, "a gradient is NaN or infinite at step " + std::to_string(first) +
                               (deviceSkips_ ? std::string(", which was not applied")
                                                  : std::string(" (the GPU's check is read at log steps; checkpoints "
                                                                "are only written from steps before it)")) +
                               (inARow > 1 ? ", " + std::to_string(inARow) + " steps in a row up to step " +
                                                 std::to_string(result_.steps)
                                           : std::string()));
  }
  result_.skippedSteps += newlyFlagged;
  if (rank_ == 0) {
    bar_.clear();
    spdlog::warn("{} step(s) up to step {} had a NaN or infinite gradient and were skipped "
                 "(train.skip_nonfinite_steps; the first of this run at step {})",
                 newlyFlagged, result_.steps, first);
  }
}

// output.profile_start: the trace of the profiled steps, one file per rank (Kineto waits for the
// GPU's activity records: sync-debug is off meanwhile).
void TrainingRun::stopProfile() {
  const bool debugging = syncDebugOn_;
  pauseSyncDebug();
  makeDirectories(config_.output.dir, "output.dir");
  const std::string path = config_.output.dir + "/profile_rank" + std::to_string(rank_) + ".json";
  const int64_t events = profiler_->stop(path);
  if (rank_ == 0) {
    bar_.clear();
    spdlog::info("output.profile_start: steps {}..{} profiled ({} events on rank 0), one Chrome trace per rank: {} "
                 "(Perfetto, chrome://tracing)", profiledFrom_, result_.steps, events, path);
  }
  if (debugging) resumeSyncDebug();
}

// cuda.sync_debug: LibTorch's sync-debug mode is on between log steps, where nothing should make
// the host wait for the GPU; off where the loop reads results.
void TrainingRun::pauseSyncDebug() {
  if (!syncDebugOn_) return;
  setCudaSyncDebugMode(CudaSyncDebugMode::kDefault);
  syncDebugOn_ = false;
}

void TrainingRun::resumeSyncDebug() {
  if (syncDebug_ == 0 || syncDebugOn_) return;
  setCudaSyncDebugMode(static_cast<CudaSyncDebugMode>(syncDebug_));
  syncDebugOn_ = true;
}

// Where the resumed epoch starts in its permutation: the checkpoint's global position, or for one
// written before those existed (same world size only) its steps × micro-batches × batch × world.
int64_t TrainingRun::resumedStart() const {
  if (resumed_.epochSamples >= 0) return std::min<int64_t>(resumed_.epochSamples, data_.train.size());
  return std::min<int64_t>(data_.train.size(),
                           resumed_.stepInEpoch * train_.accumulateSteps * train_.batchSize * world_);
}

// Sets the sampler to `epoch` from `start`; rank 0's batches from there.
int64_t TrainingRun::epochBatchesFrom(int64_t epoch, int64_t start) {
  sampler_.setEpoch(epoch, start);
  return (sampler_.numSamplesOf(0) + train_.batchSize - 1) / train_.batchSize;
}

// join: the samples every rank consumed in `place`'s micro-batch slots (rank r's shard is known
// everywhere: its first numSamplesOf(r) positions, cut into batches).
int64_t TrainingRun::samplesOverRanks(const StepPlace& place) const {
  const int64_t from = static_cast<int64_t>(place.first) * train_.batchSize;
  const int64_t to = static_cast<int64_t>(place.first + place.count) * train_.batchSize;
  int64_t total = 0;
  for (int r = 0; r < world_; ++r) {
    const int64_t n = sampler_.numSamplesOf(r);
    total += std::min(n, to) - std::min(n, from);
  }
  return total;
}

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
  if (logStep || finalStep) pauseSyncDebug();
  if (parallelism_.lossNeedsAverage() && (logStep || finalStep)) {
    // The gradient sync carries only gradients; the loss is averaged here (every rank logs alike),
    // weighted by each rank's samples in the step under join (a rank without any adds nothing).
    // The stop requests come along: [loss × weight, weight, stop].
    c10::NoGradGuard noGrad;
    const double weight = join_ ? static_cast<double>(stepRankSamples_) : 1.0;
    const at::TensorOptions o = lossForLog_.options();
    at::Tensor packed = at::cat({lossForLog_ * weight, at::full({1}, weight, o),
                                 at::full({1}, stopSignal() != 0 ? 1.0 : 0.0, o)});
    group_.allReduce(packed);
    lossForLog_.copy_(packed.slice(0, 0, 1) / packed.slice(0, 1, 2).clamp_min(1));
    stopVotes_ = packed.slice(0, 2, 3);
  }
  if (logStep) {
    awaitGraph();
    group_.waitForCollectives();  // a peer that never joined is named here, not by a hung read
    checkDeviceNonfinite();
    checkScalerSkips();
    const double lossValue = lossForLog_.item<double>();
    const double window = secondsSince(windowStart_);
    const double rate = window > 0 ? windowSamples_ / window : 0.0;
    nlohmann::json record = {{"step", result_.steps}, {"epoch", place.epoch}, {"loss", lossValue},
                             {"samples", result_.samples}, {"samples_per_s", rate}, {"elapsed_s", secondsSince(start_)},
                             {"lr", lr_}};
    if (gradNorm_.defined()) record["grad_norm"] = gradNorm_.item<double>();
    if (scaler_) record["loss_scale"] = scaler_->getScale();
    metrics_.write(record);
    shownLoss_ = lossValue;
    shownRate_ = rate;
    if (board_) board_->addTrainingStep(result_.steps, lossValue, rate, lr_);
    if (rank_ == 0) {
      bar_.clear();
      spdlog::info("{}{}", progressLine(progressAt(place, lossValue, rate)), parallelism_.progressNote());
    }
    windowStart_ = Clock::now();
    windowSamples_ = 0;
    resumeSyncDebug();
  }
  bar_.update(progressAt(place, shownLoss_, shownRate_));
}

// Preemption: every rank must stop after the same step, so a stop request (SIGTERM) is agreed on
// with a tiny all-reduce; on one, the position is saved.
bool TrainingRun::stopRequested(const TrainPosition& position) {
  if (world_ == 1) {
    if (stopSignal() == 0) return false;  // on the host: a one-rank GPU job does not wait for its device here
  } else if (stopVotes_.defined()) {  // this step's log all-reduce carried the requests
    const at::Tensor votes = std::exchange(stopVotes_, at::Tensor());
    const bool debugging = syncDebugOn_;  // on again for the steps to the next log step
    pauseSyncDebug();
    awaitGraph();
    group_.waitForCollectives();
    if (votes.item<double>() <= 0) {
      if (debugging) resumeSyncDebug();
      return false;
    }
  } else {
    pauseSyncDebug();
    {
      c10::NoGradGuard noGrad;
      stopFlag_.fill_(stopSignal() != 0 ? 1.0 : 0.0);
    }
    group_.allReduce(stopFlag_);
    awaitGraph();
    group_.waitForCollectives();
    if (stopFlag_.item<double>() <= 0) return false;
  }
  checkDeviceNonfinite();
  result_.checkpointPath = checkpointer_.save(module_, *optimizer_, position, scaler_ ? &*scaler_ : nullptr);
  result_.stopSignal = stopSignal() != 0 ? stopSignal() : SIGTERM;
  if (rank_ == 0) {
    bar_.clear();
    spdlog::warn("stopping after step {} on a signal; checkpoint {} (resume with resume=auto)", result_.steps,
                 result_.checkpointPath);
  }
  return true;
}

// After the last step: the final loss, evaluation, rank<r>_params.pt when asked, rank 0's export.
void TrainingRun::finish() {
  pauseSyncDebug();
  awaitGraph();
  group_.waitForCollectives();
  if (graph_ && rank_ == 0) {
    spdlog::info("train.cuda_graph: {} step(s) replayed from the graph, {} warm-up step(s), {} uncaptured (a batch of "
                 "another shape)", graphReplays_, graphWarmups_, uncapturedSteps_);
  }
  checkDeviceNonfinite();
  result_.finalLoss = lossForLog_.item<double>();
  checkScalerSkips();
  if (scaler_ && rank_ == 0 && result_.skippedSteps * 10 > result_.steps) {
    spdlog::warn("the fp16 loss scaler skipped {} of {} steps (gradients overflowed at scales up to {:g}); lower "
                 "train.loss_scale_init", result_.skippedSteps, result_.steps, train_.lossScaleInit);
  }
  // Finite gradients can still overflow the weights (a huge train.lr) on the last step.
  if (!allFinite(params_)) {
    throwDiverged(config_, "the weights are no longer finite after step " + std::to_string(result_.steps) +
                               ", the last one, so nothing is exported");
  }
  if (config_.eval.enabled) {
    const auto evalStart = Clock::now();
    const EvalCounts counts = [&] {
      // Evaluated in the precision it was trained in.
      const Autocast mixed(device_.type(), autocastDtype_, /*enabled=*/autocastDtype_ != at::kFloat);
      return parallelism_.evaluate(data_.test);
    }();
    result_.evalSeconds = secondsSince(evalStart);
    result_.testCorrect = counts.correct;
    result_.testTotal = counts.total;
    result_.testAccuracy = counts.accuracy();
    if (board_) board_->addScalar("test/accuracy", result_.testAccuracy, result_.steps);
  }
  const std::string& outDir = config_.output.dir;
  if (config_.output.dumpRankParams) {
    makeDirectories(outDir, "output.dir");
    saveStateDict(stateDict(module_), outDir + "/rank" + std::to_string(rank_) + "_params.pt");
  }
  if (rank_ == 0) {
    result_.exportPath = (std::filesystem::path(outDir) / config_.output.exportName).string();
    exportTrainedModel(config_, stateDict(module_), result_.exportPath);
  }
}

}  // namespace

TrainResult runTrainingLoop(const WorkerConfig& config, const Datasets& data, Parallelism& parallelism,
                            c10::Device device) {
  return TrainingRun(config, data, parallelism, device).run();
}

}  // namespace ddp::worker
