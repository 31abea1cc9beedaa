#include "worker/train/training_loop.h"

#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>

#include "common/dir_lock.h"
#include "common/error.h"
#include "ddp/ddp.h"
#include "worker/report/progress.h"
#include "worker/report/tensorboard/event_writer.h"
#include "worker/train/eager_step.h"
#include "worker/train/finite_check.h"
#include "worker/train/graph_step.h"
#include "worker/train/lm_records.h"
#include "worker/train/metrics.h"
#include "worker/train/nonfinite_tracker.h"
#include "worker/train/optimizer_setup.h"
#include "worker/train/profile_window.h"
#include "worker/train/sample_log.h"
#include "worker/train/stop_signal.h"
#include "worker/train/sync_debug.h"
#include "worker/train/train_order.h"
#include "worker/train/train_step.h"
#include "worker/train/training_checkpointer.h"
#include "worker/train/training_run.h"

namespace ddp::worker {

namespace {

// The training set's order: token windows for a language model, else DistributedSampler's.
std::unique_ptr<TrainOrder> trainOrder(const WorkerConfig& config, const Datasets& data, int world, int rank, bool join) {
  const TrainConfig& train = config.train;
  if (data.tokens) {
    TokenSamplerOptions o;
    o.batchSize = train.batchSize;
    o.blockSize = config.model.blockSize;
    o.rank = rank;
    o.world = world;
    o.seed = config.seed;
    o.sampling = *parseTokenSampling(config.data.sampling);  // validated with the config
    return data::asBadTokenInput([&] { return tokenOrder(data.tokens->train, o); });
  }
  return samplerOrder(data.trainSource(), world, rank, {train.shuffle, config.seed, train.dropLast, /*pad=*/!join},
                      train.batchSize);
}

}  // namespace

namespace loop {

TrainingRun::TrainingRun(const WorkerConfig& config, const Datasets& data, Parallelism& parallelism,
                         c10::Device device)
    : config_(config), train_(config.train), data_(data), parallelism_(parallelism), group_(parallelism.group()),
      rank_(group_.rank()), world_(group_.size()), module_(parallelism.module()),
      params_(module_.parameters(/*recurse=*/true)),
      optimizer_(makeOptimizer(train_, params_, device, group_, /*decayMatricesOnly=*/config.model.name == "gpt")),
      device_(device),
      join_(train_.unevenInputs == "join" && world_ > 1),
      order_(trainOrder(config, data, world_, rank_, join_)),
      checkpointer_(config, group_, order_->epochSize(), parallelism.cudaGenerators()),
      bar_(rank_ == 0 && progressBarWanted(), std::getenv("DDP_LAUNCH_PREFIXED") != nullptr),
      syncDebug_(config.cuda.syncDebug), nonfinite_(config, rank_, bar_), deviceChecks_(device.is_cuda()) {
  if (rank_ == 0) makeDirectories(config_.output.dir, "output.dir");
  // Under join, ranks that ran out take their steps' collectives differently: no measurement there.
  if (world_ > 1 && !join_) {
    straggler_.emplace(group_);
    result_.stragglerCounts.assign(static_cast<size_t>(world_), 0);
  }
  checkPrecision();
  // fp16 needs a loss scale; its found-inf flag is agreed on by every rank of the group.
  if (train_.precision == "fp16") {
    scaler_.emplace(group_, train_.lossScale);
  }
  if (train_.precision == "fp16" && device_.is_cpu() && rank_ == 0) {
    spdlog::warn("train.precision fp16 on a CPU: LibTorch's CPU float16 kernels are slow (tens of times slower "
                 "than fp32 for the CNN); bf16 is the CPU's mixed precision");
  }
  checkCudaSettings();
  auto* fused = dynamic_cast<FusedOptimizer*>(optimizer_.get());
  auto* sgd = dynamic_cast<torch::optim::SGD*>(optimizer_.get());
  deviceSkips_ = fused != nullptr || train_.cudaGraph;
  CudaGraph* graph = nullptr;
  if (train_.cudaGraph) {
    if (fused == nullptr && (sgd == nullptr || !fusedSgdAvailable())) {
      DDP_THROW(ConfigError, "config: 'train.cuda_graph' steps SGD (LibTorch 2.x) or fused Adam/AdamW; "
                "this optimizer cannot be captured");
    }
    graph = parallelism_.cudaGraph();
    if (graph == nullptr) DDP_THROW(ConfigError, "config: 'train.cuda_graph' is not available in this mode");
  }
  resumed_ = checkpointer_.resume(module_, *optimizer_, scaler_ ? &*scaler_ : nullptr);
  result_.steps = resumed_.globalStep;
  result_.samples = resumed_.samples;
  lastStopCheckStep_ = result_.steps;  // the first stop period measures this run's steps only
  stopFlag_ = at::zeros({2}, at::TensorOptions().dtype(at::kDouble).device(group_.collectiveDevice()));
  done_ = train_.maxSteps > 0 && result_.steps >= train_.maxSteps;
  planSteps();
  profile_.emplace(config_, device_, rank_, syncDebug_, bar_);
  lm_ = LanguageModelRecords::make(config_, data_, module_, group_, device_, parallelism_.evalForward());
  // Every check above may still refuse the config; only now are the run's files opened, so a
  // refused run leaves a finished run's metrics and resolved config in output.dir as they were.
  openRecords();
  state_.emplace(StepState{config_, parallelism_, params_, *optimizer_, *schedule_, scaler_ ? &*scaler_ : nullptr,
                           fused, device_, autocastDtype(train_.precision), join_, rank_, result_, nonfinite_,
                           syncDebug_, sampleLog_ ? &*sampleLog_ : nullptr, bar_,
                           at::zeros({1}, at::TensorOptions().device(parallelism.lossDevice())), at::Tensor(),
                           schedule_->at(result_.steps)});
  if (graph != nullptr) step_ = std::make_unique<GraphStep>(*state_, *graph, fused != nullptr ? nullptr : sgd, world_);
  else step_ = std::make_unique<EagerStep>(*state_);
}

// The run's records in output.dir: config.resolved.yaml and metrics.jsonl (rank 0; a resumed run
// appends to the metrics of the run it continues), TensorBoard, the sample logs.
void TrainingRun::openRecords() {
  if (rank_ == 0) openRankZeroRecords(/*appendMetrics=*/resumed_.globalStep > 0);
  if (config_.output.sampleLog) {
    // A resumed run, or a restart of this job (which may have failed before its first checkpoint),
    // continues the logs; a fresh run starts them anew.
    sampleLog_.emplace(config_.output.dir, rank_, world_, resumed_.globalStep > 0 || launchEnv().restartCount > 0);
  }
}

// Rank 0's: config.resolved.yaml, metrics.jsonl and TensorBoard's events (output.tensorboard).
void TrainingRun::openRankZeroRecords(bool appendMetrics) {
  const std::string& dir = config_.output.dir;
  writeFileAtomic(dir + "/config.resolved.yaml", dumpConfig(config_));
  metrics_ = MetricsWriter(dir + "/metrics.jsonl", appendMetrics);
  if (config_.output.tensorboard) board_ = std::make_unique<tensorboard::EventWriter>(dir + "/tensorboard");
}

// output.dir deleted while the job runs (a clean-up of old runs, a tmp cleaner): each rank makes its
// records again, and the final outputs go there too. What the deleted files held is lost, the run
// is not (rank 0 says so).
void TrainingRun::keepRecords() {
  const std::string& dir = config_.output.dir;
  if (sampleLog_ && sampleLog_->removed()) sampleLog_.emplace(dir, rank_, world_, /*append=*/true);
  if (!metrics_.removed()) return;
  makeDirectories(dir, "output.dir");
  // The job's lock went with the directory: taken again, or said taken by a job that came meanwhile.
  const std::string refused = dirLockRefusal(lockDirectory(dir, kJobLockFile), dir, kJobLockFile, "output.dir");
  if (!refused.empty()) spdlog::warn("output.dir: {}{}; this job's records go there as well", dir, refused);
  openRankZeroRecords(/*appendMetrics=*/true);  // another file put there: kept
  spdlog::warn("output.dir: {}/metrics.jsonl was deleted while the job ran (was {} removed?); made config.resolved.yaml"
               " and metrics.jsonl{} again there, from step {} on (the records before are lost); the checkpoints and"
               " the export go there as well",
               dir, dir, board_ ? ", tensorboard/" : "", result_.steps);
}

// Whether this LibTorch can autocast the device to train.precision.
void TrainingRun::checkPrecision() const {
  const at::ScalarType dtype = autocastDtype(train_.precision);
  if (dtype != at::kFloat && !Autocast::supports(device_.type(), dtype)) {
    DDP_THROW(ConfigError, "config: 'train.precision' is ", train_.precision, " but this LibTorch cannot autocast ",
              device_.str(), " to it; use bf16 on a CPU (fp16 needs LibTorch 2.x there) or fp32");
  }
}

// cuda.sync_debug and train.cuda_graph need a GPU (and the graph NCCL's collectives).
void TrainingRun::checkCudaSettings() const {
  if (syncDebug_.enabled() && !device_.is_cuda()) {
    DDP_THROW(ConfigError, "config: 'cuda.sync_debug' is ", config_.cuda.syncDebug, " but this rank trains on ",
              device_.str(), "; it checks GPU runs (device cuda), use off here");
  }
  if (train_.cudaGraph && !device_.is_cuda()) {
    DDP_THROW(ConfigError, "config: 'train.cuda_graph' is true but this rank trains on ", device_.str(),
              "; CUDA graphs need a GPU (device cuda), set it false here");
  }
  if (train_.cudaGraph && world_ > 1 && group_.backend() != Backend::kNccl) {
    DDP_THROW(ConfigError, "config: 'train.cuda_graph' is true but the backend is ", backendName(group_.backend()),
              ", whose collectives on GPU tensors go through the host; use backend nccl");
  }
}

// The job's steps (for the schedule and the progress line): every rank takes as many steps per
// epoch (the sampler pads, or under join the ranks short of a batch join the others' steps; rank 0's
// shard is the largest), and a resumed run the steps it took, the rest of the interrupted epoch at
// this world size and whole epochs after it (the total of an uninterrupted run when the world size
// did not change).
void TrainingRun::planSteps() {
  perEpoch_ = stepsPerEpoch(epochBatchesFrom(0, 0), train_.accumulateSteps);
  if (perEpoch_ == 0) {  // every rank computes the same: all refuse alike
    DDP_THROW(ConfigError, "config: no training step to take: ", order_->epochSize(), " training samples over ", world_,
              " ranks leave each none",
              train_.dropLast ? " with train.drop_last=true (which drops what does not fill every rank); set it "
                                "false, or use more data or fewer ranks"
                              : "; use more data");
  }
  jobSteps_ = totalSteps(train_.epochs, perEpoch_, train_.maxSteps);
  if (result_.steps > 0 && resumed_.epoch < train_.epochs) {
    const int64_t left = stepsPerEpoch(epochBatchesFrom(resumed_.epoch, resumedStart()), train_.accumulateSteps);
    const int64_t all = result_.steps + left + perEpoch_ * (train_.epochs - resumed_.epoch - 1);
    jobSteps_ = train_.maxSteps > 0 ? std::min(all, train_.maxSteps) : all;
  }
  // A run resumed at its end takes no step: no warning about a warm-up it will not run.
  schedule_.emplace(makeSchedule(train_, jobSteps_, result_.steps < jobSteps_ ? rank_ : -1));
}

TrainResult TrainingRun::run() {
  start_ = Clock::now();
  windowStart_ = start_;
  for (int64_t epoch = resumed_.epoch; epoch < train_.epochs && !done_; ++epoch) runEpoch(epoch);
  syncDebug_.pause();
  profile_->finish(result_.steps);  // the run ended inside the profiled steps
  bar_.clear();
  result_.trainSeconds = secondsSince(start_);
  result_.samplesPerSecond = result_.trainSeconds > 0 ? runSamples_ / result_.trainSeconds : 0;
  if (lm_) {
    result_.tokensPerSecond = lm_->tokensPerSecond(result_.samplesPerSecond);
    result_.mfu = lm_->mfu(result_.samplesPerSecond).value_or(-1.0);
  }
  parallelism_.describe(result_);
  parallelism_.describeMemory(result_);
  result_.optimizerStateBytes = std::max<int64_t>(0, optimizerStateBytes(*optimizer_));
  if (result_.stopSignal != 0) return result_;  // preempted: the checkpoint is the record
  if (resumed_.globalStep > 0 && runSamples_ == 0 && outputsInPlace()) {
    result_.outputsKept = true;  // a finished run resumed again (a requeue, a restart loop)
    return result_;
  }
  finish();
  return result_;
}

// Resumed at the run's end, nothing trained: the run that took the steps wrote its outputs, and
// rewriting them would replace its loss and throughput with this process's nothing. Left as they
// are where the export is there and summary.json counts this checkpoint's steps (not an earlier,
// shorter run's, which a preemption before the export would leave); rank 0 looks, every rank
// learns it. Else evaluated and exported anew.
bool TrainingRun::outputsInPlace() {
  const std::string& dir = config_.output.dir;
  const bool here = rank_ == 0 && std::filesystem::exists(std::filesystem::path(dir) / config_.output.exportName) &&
                    summarySteps(dir + "/summary.json") == result_.steps;
  at::Tensor flag = at::full({1}, here ? 1.0 : 0.0, at::TensorOptions().device(device_));
  group_.allReduce(flag);
  const bool kept = flag.item<double>() > 0;
  if (rank_ == 0) {
    spdlog::info("nothing left to train: the checkpoint is at the run's end (step {}){}", result_.steps,
                 kept ? "; summary.json and " + config_.output.exportName + " of the run that took the steps are left "
                        "as they are"
                      : "; evaluating and exporting it, as that run's outputs are missing");
  }
  return kept;
}

void TrainingRun::runEpoch(int64_t epoch) {
  const int64_t accumulate = train_.accumulateSteps;
  // A resumed epoch continues after the samples of its permutation already seen, at any world size
  // (at the same one, exactly where the interrupted run's shards were).
  epochStart_ = epoch == resumed_.epoch ? resumedStart() : 0;
  epochStepOffset_ = epoch == resumed_.epoch && epochStart_ > 0 ? resumed_.stepInEpoch : 0;
  epochBatches_ = static_cast<std::size_t>(epochBatchesFrom(epoch, epochStart_));
  const auto batches = order_->batches();
  module_.train();
  // Made ahead by the loader's threads (data.num_workers).
  const auto loader = order_->loader(batches, parallelism_.loading(epoch, /*training=*/true));
  // An optimizer step takes `accumulate` micro-batches (fewer at the end of an epoch);
  // only the last one's backward communicates (DDP's no_sync for the others).
  for (std::size_t first = 0; first < epochBatches_; first += accumulate) {
    const StepPlace place{epoch, first, std::min<std::size_t>(accumulate, epochBatches_ - first), epochBatches_};
    {
      // output.profile_start: the step as one "ProfilerStep#N" span, as torch.profiler marks them.
      const auto span = profile_->beginStep(result_.steps + 1);
      stepRankSamples_ = step_->run(batches, *loader, place);
    }
    ++result_.steps;
    ++runSteps_;
    // Padded, every rank's batch has the same size; join: every rank knows every rank's share.
    const int64_t stepSamples =
        join_ ? order_->samplesInBatches(static_cast<int64_t>(place.first), static_cast<int64_t>(place.count))
              : stepRankSamples_ * world_;
    result_.samples += stepSamples;
    runSamples_ += stepSamples;
    windowSamples_ += stepSamples;
    const bool last = train_.maxSteps > 0 && result_.steps >= train_.maxSteps;
    record(place, last);
    profile_->endStep(result_.steps);
    const TrainPosition position = positionAfter(place);
    saveIfDue(position, place.epochEnded());
    // GPU, world > 1: at log steps only, where the request came with the loss (stopVotes_).
    const bool stopCheck = world_ == 1 || stopVotes_.defined() ||
                           (!deviceChecks_ && (result_.steps >= nextStopCheck_ || place.epochEnded()));
    if ((stopCheck && stopRequested(position)) || last) {
      done_ = true;
      return;
    }
  }
  syncDebug_.pause();  // a new epoch's loader starts its threads and pinned buffers
}

// The position after the step at `place` (the sampler is at the epoch and its epochStart_).
TrainPosition TrainingRun::positionAfter(const StepPlace& place) const {
  const int64_t micro = microSteps();
  if (place.epochEnded()) return TrainPosition{place.epoch + 1, 0, result_.steps, result_.samples, 0, micro};
  const int64_t consumed = order_->positionAfter(static_cast<int64_t>(place.first + place.count));
  return TrainPosition{place.epoch, epochStepOffset_ + static_cast<int64_t>(place.first) / train_.accumulateSteps + 1,
                       result_.steps, result_.samples, consumed, micro};
}

// checkpoint.every_steps / every_epoch: never a checkpoint of weights a non-finite step reached.
void TrainingRun::saveIfDue(const TrainPosition& position, bool epochEnded) {
  if (!checkpointer_.due(position, epochEnded)) return;
  const SyncDebug::Paused paused(syncDebug_);
  step_->await();
  group_.waitForCollectives();
  nonfinite_.check(result_, deviceSkips_);
  checkpointer_.save(module_, *optimizer_, position, scaler_ ? &*scaler_ : nullptr);
}

// Where the resumed epoch starts in its permutation: the checkpoint's global position, or for one
// written before those existed (same world size only) the position after its steps' micro-batches
// from the epoch's start. Leaves the sampler at the resumed epoch's start; its callers set it next.
int64_t TrainingRun::resumedStart() {
  if (resumed_.epochSamples >= 0) return std::min<int64_t>(resumed_.epochSamples, order_->epochSize());
  order_->setEpoch(resumed_.epoch, 0, /*firstMicroStep=*/0);  // for positionAfter only: no batches drawn
  return order_->positionAfter(resumed_.stepInEpoch * train_.accumulateSteps);
}

// Sets the sampler to `epoch` from `start`, after the steps taken so far (random token windows are
// drawn per micro-batch of the run); the batches every rank steps through from there.
int64_t TrainingRun::epochBatchesFrom(int64_t epoch, int64_t start) {
  return order_->setEpoch(epoch, start, microSteps());
}

// The run's micro-batches after the steps taken so far (counted on from the resumed checkpoint's).
int64_t TrainingRun::microSteps() const {
  return microStepsAfter(resumed_.globalStep, resumed_.microSteps, result_.steps, train_.accumulateSteps);
}

}  // namespace loop

TrainResult runTrainingLoop(const WorkerConfig& config, const Datasets& data, Parallelism& parallelism,
                            c10::Device device) {
  return loop::TrainingRun(config, data, parallelism, device).run();
}

}  // namespace ddp::worker
