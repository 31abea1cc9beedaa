#include "worker/train/training_loop.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>

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

namespace ddp::worker {

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Steps between the all-reduces that agree on a stop request (SIGTERM): the
// reaction time is this many steps, the cost one 4-byte collective per period. On a GPU the
// request rides on the log steps' loss all-reduce instead (no host read between log steps).
constexpr int64_t kStopCheckEvery = 10;

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

// One run of the loop: what the steps share, the epochs, and after each step its records.
class TrainingRun {
 public:
  TrainingRun(const WorkerConfig& config, const Datasets& data, Parallelism& parallelism, c10::Device device);
  TrainResult run();

 private:
  void checkPrecision() const;
  void checkCudaSettings() const;
  void planSteps();
  void openRecords();
  void runEpoch(int64_t epoch);
  TrainPosition positionAfter(const StepPlace& place) const;
  void saveIfDue(const TrainPosition& position, bool epochEnded);
  void record(const StepPlace& place, bool last);
  void recordValidation();
  void countSkippedImages();
  bool stopRequested(const TrainPosition& position);
  bool outputsInPlace();
  void finish();
  int64_t resumedStart();
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
  std::optional<GradScaler> scaler_;  // train.precision: fp16
  std::unique_ptr<TrainOrder> order_;  // the epochs' batches: DistributedSampler's, or token windows'
  TrainingCheckpointer checkpointer_;
  TrainPosition resumed_;
  MetricsWriter metrics_;
  TrainResult result_;
  ProgressBar bar_;
  SyncDebug syncDebug_;  // cuda.sync_debug: on between log steps
  NonFiniteTracker nonfinite_;
  std::optional<SampleLog> sampleLog_;               // output.sample_log
  std::unique_ptr<tensorboard::EventWriter> board_;  // output.tensorboard: the scalars
                                                     // torch.utils.tensorboard users log, from rank 0
  std::optional<ProfileWindow> profile_;             // output.profile_start
  // Who arrives last at the gradient all-reduce, looked at on every logged step (world > 1).
  std::optional<StragglerMonitor> straggler_;
  std::unique_ptr<LanguageModelRecords> lm_;  // model.name gpt: tokens/s, MFU, the validation loss
  int64_t validatedStep_ = -1;                // the step of the last validation loss
  std::string stragglerNote(const StragglerReport& report);
  std::optional<StepState> state_;
  std::unique_ptr<TrainStep> step_;  // eager, or train.cuda_graph's
  at::Tensor stopFlag_;
  // On a GPU nothing between log steps reads the device: the non-finite check is a device flag,
  // read at log steps (and before a checkpoint), and (world > 1) the stop request rides on the log
  // steps' loss all-reduce.
  const bool deviceChecks_;
  bool deviceSkips_ = false;  // the optimizer skips a flagged step on the device
  at::Tensor stopVotes_;      // the last log step's summed stop requests (device), or undefined
  int64_t runSamples_ = 0;    // this process's share of the throughput figure
  int64_t runSteps_ = 0;
  int64_t windowSamples_ = 0;
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
};

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
  stopFlag_ = at::zeros({1}, at::TensorOptions().device(group_.collectiveDevice()));
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
  if (rank_ == 0) {
    writeFileAtomic(config_.output.dir + "/config.resolved.yaml", dumpConfig(config_));
    metrics_ = MetricsWriter(config_.output.dir + "/metrics.jsonl", resumed_.globalStep > 0);
    if (config_.output.tensorboard) {
      board_ = std::make_unique<tensorboard::EventWriter>(config_.output.dir + "/tensorboard");
    }
  }
  if (config_.output.sampleLog) sampleLog_.emplace(config_.output.dir, rank_, world_);
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
  schedule_.emplace(makeSchedule(train_, jobSteps_, rank_));
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
                           (!deviceChecks_ && (result_.steps % kStopCheckEvery == 0 || place.epochEnded()));
    if ((stopCheck && stopRequested(position)) || last) {
      done_ = true;
      return;
    }
  }
  syncDebug_.pause();  // a new epoch's loader starts its threads and pinned buffers
}

// The position after the step at `place` (the sampler is at the epoch and its epochStart_).
TrainPosition TrainingRun::positionAfter(const StepPlace& place) const {
  if (place.epochEnded()) return TrainPosition{place.epoch + 1, 0, result_.steps, result_.samples, 0};
  const int64_t consumed = order_->positionAfter(static_cast<int64_t>(place.first + place.count));
  return TrainPosition{place.epoch, epochStepOffset_ + static_cast<int64_t>(place.first) / train_.accumulateSteps + 1,
                       result_.steps, result_.samples, consumed};
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
  order_->setEpoch(resumed_.epoch, 0);
  return order_->positionAfter(resumed_.stepInEpoch * train_.accumulateSteps);
}

// Sets the sampler to `epoch` from `start`; the batches every rank steps through from there.
int64_t TrainingRun::epochBatchesFrom(int64_t epoch, int64_t start) {
  return order_->setEpoch(epoch, start);
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
  result_.valLoss = lm_->validationLoss(state_->autocastDtype);
  validatedStep_ = result_.steps;
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
    {
      c10::NoGradGuard noGrad;
      stopFlag_.fill_(stopSignal() != 0 ? 1.0 : 0.0);
    }
    group_.allReduce(stopFlag_);
    step_->await();
    group_.waitForCollectives();
    if (stopFlag_.item<double>() <= 0) return false;
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
    spdlog::warn("the fp16 loss scaler skipped {} of {} steps (gradients overflowed at scales up to {:g}); lower "
                 "train.loss_scale_init", result_.skippedSteps, result_.steps, train_.lossScale.initScale);
  }
  // Finite gradients can still overflow the weights (a huge train.lr) on the last step.
  if (!parallelism_.allFiniteOnEveryRank(params_)) {
    throwDiverged(config_, "the weights are no longer finite after step " + std::to_string(result_.steps) +
                               ", the last one, so nothing is exported");
  }
  if (config_.eval.enabled && lm_) {
    if (lm_->hasValidation() && validatedStep_ != result_.steps) recordValidation();
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

}  // namespace

TrainResult runTrainingLoop(const WorkerConfig& config, const Datasets& data, Parallelism& parallelism,
                            c10::Device device) {
  return TrainingRun(config, data, parallelism, device).run();
}

}  // namespace ddp::worker
