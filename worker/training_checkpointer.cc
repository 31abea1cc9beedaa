#include "worker/training_checkpointer.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <spdlog/spdlog.h>
#include <torch/nn/module.h>
#include <torch/optim/sgd.h>

#include "common/error.h"
#include "worker/atomic_file.h"
#include "worker/checkpoint/checkpoint_dir.h"
#include "worker/checkpoint/optimizer_state.h"
#include "worker/checkpoint/state_dict_loader.h"
#include "worker/checkpoint/training_checkpoint.h"
#include "worker/model_export.h"

namespace ddp::worker {
namespace {

checkpoint::NamedTensors namedParameters(torch::nn::Module& module) {
  checkpoint::NamedTensors out;
  for (const auto& item : module.named_parameters(true)) out.emplace_back(item.key(), item.value());
  return out;
}

}  // namespace

TrainingCheckpointer::TrainingCheckpointer(const WorkerConfig& config, comm::Communicator& comm,
                                           c10::Device device)
    : config_(config), comm_(comm), device_(device), dir_(checkpointDir(config)) {}

std::vector<at::Tensor> TrainingCheckpointer::gatherCudaRngStates() {
  const at::Tensor mine = checkpoint::cudaRngState(device_);
  if (!mine.defined()) return {};
  // Rank r fills row r only, so a SUM all-reduce is a gather (there is no gather in Communicator).
  at::Tensor rows = at::zeros({comm_.size(), mine.numel()}, at::kLong);
  rows[comm_.rank()].copy_(mine);
  rows = rows.to(comm_.device());
  comm_.allReduceSum(rows);
  rows = rows.cpu();
  std::vector<at::Tensor> out;
  for (int r = 0; r < comm_.size(); ++r) out.push_back(rows[r].to(at::kByte).clone());
  return out;
}

TrainPosition TrainingCheckpointer::resume(torch::nn::Module& module, torch::optim::SGD& optimizer) {
  if (config_.resume.empty()) return {};
  std::string path = config_.resume;
  if (config_.resume == "auto") {
    const auto found = checkpoint::latestValidCheckpoint(dir_, [&](const std::string& p, const std::string& why) {
      if (comm_.rank() == 0) spdlog::warn("resume: skipping {}: {}", p, why);
    });
    path = found.value_or("");
  }
  checkpoint::TrainingState state;
  if (!path.empty()) state = checkpoint::loadTrainingCheckpoint(path);
  const int64_t step = path.empty() ? -1 : state.globalStep;

  // Every rank must continue from the same step, or the collectives mismatch.
  at::Tensor steps = at::tensor({step, int64_t{1}}, at::kLong).to(comm_.device());
  comm_.allReduceSum(steps);
  steps = steps.cpu();
  if (steps[0].item<int64_t>() != step * steps[1].item<int64_t>()) {
    DDP_THROW(CommError, "resume: ranks found different checkpoints (rank ", comm_.rank(), " has step ", step,
              " from '", path.empty() ? "<none>" : path, "'); point every rank at the same checkpoint.dir");
  }
  if (path.empty()) {
    if (comm_.rank() == 0) spdlog::info("resume: no checkpoint in {}; starting from the beginning", dir_);
    return {};
  }

  checkpoint::loadStateDictInto(module, state.model, path);
  checkpoint::restoreSgdMomentumBuffers(optimizer, namedParameters(module), state.optimizer, path);
  checkpoint::setCpuRngState(state.cpuRng);
  const auto rank = static_cast<size_t>(comm_.rank());
  if (device_.is_cuda() && rank < state.cudaRng.size()) {
    checkpoint::setCudaRngState(device_, state.cudaRng[rank]);  // this rank's own generator
  } else if (device_.is_cuda()) {
    spdlog::warn("resume: {} holds no CUDA generator state for rank {}; its GPU generator keeps the seed",
                 path, comm_.rank());
  }
  TrainPosition position{state.epoch, state.stepInEpoch, state.globalStep, state.samples};
  if (state.worldSize != comm_.size()) {
    // The sampler's shards depend on the world size: the saved position means nothing now.
    if (comm_.rank() == 0) {
      spdlog::warn("resume: {} was written by {} ranks, this job has {}; restarting epoch {} from its first batch",
                   path, state.worldSize, comm_.size(), state.epoch);
    }
    position.stepInEpoch = 0;
  }
  lastSavedStep_ = position.globalStep;
  if (comm_.rank() == 0) {
    spdlog::info("resumed from {} at epoch {} step {} (global step {})", path, position.epoch,
                 position.stepInEpoch, position.globalStep);
  }
  return position;
}

void TrainingCheckpointer::maybeSave(torch::nn::Module& module, torch::optim::SGD& optimizer,
                                     const TrainPosition& position, bool epochEnded) {
  const auto& c = config_.checkpoint;
  const bool byStep = c.everySteps > 0 && position.globalStep % c.everySteps == 0;
  // position.epoch is already the next epoch when one has just ended.
  const bool byEpoch = c.everyEpochs > 0 && epochEnded && position.epoch % c.everyEpochs == 0;
  if ((byStep || byEpoch) && position.globalStep != lastSavedStep_) save(module, optimizer, position);
}

std::string TrainingCheckpointer::save(torch::nn::Module& module, torch::optim::SGD& optimizer,
                                       const TrainPosition& position) {
  const std::string path = checkpoint::checkpointPath(dir_, position.globalStep);
  if (position.globalStep == lastSavedStep_) return path;  // this very step is on disk already
  std::vector<at::Tensor> cudaRng = gatherCudaRngStates();  // collective: before rank 0 writes
  if (comm_.rank() == 0) {
    makeDirectories(dir_, "checkpoint.dir");
    checkpoint::TrainingState state;
    for (auto& [key, tensor] : stateDict(module)) state.model.emplace_back(key, tensor);
    state.optimizer = checkpoint::sgdMomentumBuffers(optimizer, namedParameters(module));
    state.epoch = position.epoch;
    state.stepInEpoch = position.stepInEpoch;
    state.globalStep = position.globalStep;
    state.samples = position.samples;
    state.worldSize = comm_.size();
    state.seed = static_cast<int64_t>(config_.seed);
    state.cpuRng = checkpoint::cpuRngState();
    state.cudaRng = std::move(cudaRng);
    state.config = dumpConfig(config_);
    try {
      checkpoint::saveTrainingCheckpoint(state, path);
    } catch (const CheckpointError& e) {
      // The new checkpoint is written before the oldest is removed: keep_last=N needs room for N+1.
      if (std::string(e.what()).find(std::strerror(ENOSPC)) == std::string::npos) throw;
      const auto kept = checkpoint::listCheckpoints(dir_);
      std::error_code ec;
      const auto bytes = kept.empty() ? 0 : std::filesystem::file_size(kept.back(), ec);
      const int64_t keep = config_.checkpoint.keepLast;
      const std::string size = ec || bytes == 0 ? std::string() : " of " + std::to_string(bytes >> 20) + " MiB";
      DDP_THROW(CheckpointError, e.what(), "; checkpoint.keep_last=", keep,
                keep > 0 ? " needs room for " + std::to_string(keep + 1) + " checkpoints" + size +
                               " (the new one is written before the oldest is removed)"
                         : " keeps every checkpoint" + size,
                ": free space in ", dir_, " or lower checkpoint.keep_last");
    }
    checkpoint::pruneCheckpoints(dir_, config_.checkpoint.keepLast);
    spdlog::info("checkpoint {} (epoch {} step {})", path, position.epoch, position.stepInEpoch);
  }
  // No rank runs ahead of a save: a crash right after it loses nothing on anyone.
  comm_.barrier();
  lastSavedStep_ = position.globalStep;
  return path;
}

}  // namespace ddp::worker
