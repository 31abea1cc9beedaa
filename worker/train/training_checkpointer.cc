#include "worker/train/training_checkpointer.h"

#include <spdlog/spdlog.h>

#include <optional>
#include <sstream>
#include <string>

#include "worker/config/config_changes.h"
#include "worker/models/models.h"


namespace ddp::worker {
namespace {

CheckpointOptions checkpointOptions(const WorkerConfig& config, int64_t trainSamples,
                                    std::vector<c10::Device> cudaGenerators) {
  CheckpointOptions o;
  o.cudaGenerators = std::move(cudaGenerators);
  o.dir = checkpointDir(config);
  o.keepLast = config.checkpoint.keepLast;
  o.seed = config.seed;
  o.sampleOrder = {{"train.shuffle", config.train.shuffle ? "true" : "false"},
                   {"training samples", std::to_string(trainSamples)}};
  o.config = dumpConfig(config);
  return o;
}

}  // namespace

TrainingCheckpointer::TrainingCheckpointer(const WorkerConfig& config, ProcessGroup group, int64_t trainSamples,
                                           std::vector<c10::Device> cudaGenerators)
    : config_(config),
      rank_(group.rank()),
      checkpointer_(std::move(group), withRecordedConfigCheck(checkpointOptions(config, trainSamples,
                                                                                std::move(cudaGenerators)))) {}

CheckpointOptions TrainingCheckpointer::withRecordedConfigCheck(CheckpointOptions options) {
  // A GPT of another n_head is refused before anything is loaded (or logged as resumed).
  options.checkRecordedConfig = [this](const std::string& recordedConfig, const std::string& path) {
    if (resuming_ == nullptr) return;
    try {
      checkResumedModelSettings(*resuming_, recordedConfig, path);
    } catch (const CheckpointError& e) {
      throw ConfigError(e.what());  // "set model.n_head=2": this run's config to mend (exit 2)
    }
  };
  return options;
}

TrainPosition TrainingCheckpointer::resume(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                           GradScaler* scaler) {
  if (config_.resume.empty()) return {};
  struct Resuming {  // the module checkRecordedConfig compares, while resume runs (a throw included)
    const torch::nn::Module*& slot;
    ~Resuming() { slot = nullptr; }
  } resuming{resuming_ = &module};
  const std::optional<TrainPosition> position = config_.resume == "auto"
                                                    ? checkpointer_.resume(module, optimizer, scaler)
                                                    : checkpointer_.resumeFrom(config_.resume, module, optimizer, scaler);
  const std::string from = config_.resume == "auto" ? checkpointDir(config_) : config_.resume;
  // A resume with another learning rate or batch size is allowed (a user may mean it) but never silent.
  if (position && rank_ == 0) {
    const std::string changes = describeResumeChanges(checkpointer_.resumedConfig(), config_, from);
    std::istringstream lines(changes);
    for (std::string line; std::getline(lines, line);) spdlog::warn("{}", line);
  }
  return position.value_or(TrainPosition{});
}

bool TrainingCheckpointer::due(const TrainPosition& position, bool epochEnded) const {
  const auto& c = config_.checkpoint;
  const bool byStep = c.everySteps > 0 && position.globalStep % c.everySteps == 0;
  // position.epoch is already the next epoch when one has just ended.
  const bool byEpoch = c.everyEpochs > 0 && epochEnded && position.epoch % c.everyEpochs == 0;
  return byStep || byEpoch;
}

void TrainingCheckpointer::maybeSave(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                     const TrainPosition& position, bool epochEnded, const GradScaler* scaler) {
  if (due(position, epochEnded)) save(module, optimizer, position, scaler);
}

std::string TrainingCheckpointer::save(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                       const TrainPosition& position, const GradScaler* scaler) {
  return checkpointer_.save(module, optimizer, position, scaler);
}

}  // namespace ddp::worker
