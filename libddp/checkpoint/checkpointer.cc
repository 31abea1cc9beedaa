// ddp::saveModel / loadModel (the rank-0 export) and ddp::Checkpointer (training checkpoints).
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <spdlog/spdlog.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "libddp/internal.h"
#include "common/error.h"
#include "ddp/ddp.h"
#include "ddp/files.h"
#include "libddp/checkpoint/checkpoint_dir.h"
#include "libddp/checkpoint/checkpoint_ownership.h"
#include "libddp/checkpoint/checkpointer_optimizer.h"
#include "libddp/checkpoint/optimizer_state.h"
#include "libddp/checkpoint/sharded_checkpoint.h"
#include "libddp/checkpoint/state_dict_loader.h"
#include "libddp/checkpoint/training_checkpoint.h"
#include "ddp/state_dict.h"

namespace ddp {
namespace {

// "the 2nd epoch": epochs counted from 1 in words, so the line reads the same to a loop that numbers
// them from 0 (TrainPosition, DistributedSampler::set_epoch) and to one that prints "epoch 1/3".
std::string nthEpoch(int64_t epoch) {
  const int64_t n = epoch + 1;
  const char* suffix = "th";
  if (n % 100 < 11 || n % 100 > 13) {
    if (n % 10 == 1) suffix = "st";
    else if (n % 10 == 2) suffix = "nd";
    else if (n % 10 == 3) suffix = "rd";
  }
  return "the " + std::to_string(n) + suffix + " epoch";
}

// "global step 20, 4 steps into the 2nd epoch" / "global step 13, at the end of the 1st epoch" (an
// epoch-end checkpoint's position is the next epoch's start: the last epoch's has no next one).
std::string describePosition(const TrainPosition& position) {
  std::string out = "global step " + std::to_string(position.globalStep) + ", ";
  if (position.stepInEpoch == 0) {
    if (position.epoch == 0) return out.append("at the start of ").append(nthEpoch(0));
    return out.append("at the end of ").append(nthEpoch(position.epoch - 1));
  }
  return out.append(std::to_string(position.stepInEpoch))
      .append(position.stepInEpoch == 1 ? " step into " : " steps into ")
      .append(nthEpoch(position.epoch));
}

bool samePosition(const TrainPosition& a, const TrainPosition& b) {
  return a.epoch == b.epoch && a.stepInEpoch == b.stepInEpoch && a.globalStep == b.globalStep &&
         a.samples == b.samples && a.epochSamples == b.epochSamples && a.microSteps == b.microSteps;
}

// What a checkpoint holds of this rank: its model and optimizer entries (ZeRO's gathered shards
// when given), the position, the generators and the scaler.
checkpoint::TrainingState trainingState(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                        std::optional<checkpoint::NamedTensors>& sharded, const TrainPosition& position,
                                        int worldSize, const CheckpointOptions& options,
                                        const std::vector<at::Tensor>& cpuRngRanks,
                                        const std::vector<at::Tensor>& cudaRng, const GradScaler* scaler) {
  checkpoint::TrainingState state;
  for (auto& [key, tensor] : stateDict(module)) state.model.emplace_back(key, tensor);
  state.optimizer = sharded ? std::move(*sharded) : checkpoint::optimizerState(optimizer, module);
  state.epoch = position.epoch;
  state.stepInEpoch = position.stepInEpoch;
  state.globalStep = position.globalStep;
  state.samples = position.samples;
  state.worldSize = worldSize;
  if (position.epochSamples >= 0) state.epochSamples = position.epochSamples;
  if (position.microSteps >= 0) state.microSteps = position.microSteps;
  state.seed = static_cast<int64_t>(options.seed);
  state.sampleOrder = options.sampleOrder;
  state.cpuRng = cpuRngRanks.empty() ? checkpoint::cpuRngState() : cpuRngRanks.front();
  if (cpuRngRanks.size() > 1) state.cpuRngRanks.assign(cpuRngRanks.begin() + 1, cpuRngRanks.end());
  state.cudaRng = cudaRng;
  state.config = options.config;
  if (scaler != nullptr) {
    if (const auto st = scaler->stateDict()) {
      state.scaler = checkpoint::ScalerState{st->scale, st->growthFactor, st->backoffFactor, st->growthInterval,
                                             st->growthTracker};
    }
  }
  return state;
}

// CheckpointOptions::cudaGenerators: one process's GPUs, in order (a replica without a CUDA
// generator, a CPU one, keeps an empty slot so the order holds).
std::vector<at::Tensor> ownCudaRngStates(const ProcessGroup& group, const std::vector<c10::Device>& devices) {
  if (group.size() != 1) {
    DDP_THROW(ConfigError, "ddp::CheckpointOptions::cudaGenerators is for a one-process job (DataParallel's replicas); "
              "this group has ", group.size(), " ranks, each of which keeps its own GPU's generator: leave it empty");
  }
  std::vector<at::Tensor> out;
  for (const c10::Device& d : devices) {
    const at::Tensor state = d.is_cuda() ? checkpoint::cudaRngState(d) : at::Tensor();
    out.push_back(state.defined() ? state : at::empty({0}, at::kByte));
  }
  return out;
}

// Every rank's `mine` (a generator's state, bytes of the same size on every rank), by rank: rank
// r fills row r only, so a SUM all-reduce is a gather. Collective.
std::vector<at::Tensor> gatherStates(ProcessGroup& group, const at::Tensor& mine) {
  at::Tensor rows = at::zeros({group.size(), mine.numel()}, at::kLong);
  rows[group.rank()].copy_(mine);
  rows = rows.to(group.collectiveDevice());
  group.allReduce(rows);
  rows = rows.cpu();
  std::vector<at::Tensor> out;
  for (int r = 0; r < group.size(); ++r) out.push_back(rows[r].to(at::kByte).clone());
  return out;
}

std::vector<at::Tensor> gatherCudaRngStates(ProcessGroup& group, c10::Device device) {
  const at::Tensor mine = checkpoint::cudaRngState(device);
  if (!mine.defined()) return {};
  return gatherStates(group, mine);
}

// Every rank's CPU generator (ranks seeded apart draw apart: dropout, augmentation); none for one.
std::vector<at::Tensor> gatherCpuRngStates(ProcessGroup& group) {
  if (group.size() == 1) return {};
  return gatherStates(group, checkpoint::cpuRngState());
}

// Bytes of a checkpoint: its file, or the files of a sharded checkpoint's directory (0: unknown).
uintmax_t checkpointBytes(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    const auto bytes = std::filesystem::file_size(path, ec);
    return ec ? 0 : bytes;
  }
  uintmax_t total = 0;
  for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
    const auto bytes = entry.file_size(ec);
    if (!ec) total += bytes;
  }
  return total;
}

// A save that met a full disk says why it needs room: the new checkpoint (one file or a sharded
// directory) is written before the oldest is removed, so keepLast=N needs room for N+1. Any other
// error goes on as it is.
[[noreturn]] void rethrowSaveError(const CheckpointError& e, const std::string& dir, int64_t keep) {
  if (std::string(e.what()).find(std::strerror(ENOSPC)) == std::string::npos) throw e;
  const auto kept = checkpoint::listCheckpoints(dir);
  const uintmax_t bytes = kept.empty() ? 0 : checkpointBytes(kept.back());
  // KiB below a MiB: "checkpoints of 0 MiB" said nothing about a 0.4 MiB file.
  const std::string size = bytes == 0                     ? std::string()
                           : bytes < (uintmax_t{1} << 20) ? " of " + std::to_string((bytes + 1023) >> 10) + " KiB"
                                                          : " of " + std::to_string(bytes >> 20) + " MiB";
  DDP_THROW(CheckpointError, e.what(), "; ", "ddp::CheckpointOptions::keepLast", "=", keep,
            keep > 0 ? " needs room for " + std::to_string(keep + 1) + " checkpoints" + size +
                           " (the new one is written before the oldest is removed)"
                     : " keeps every checkpoint" + size,
            ": free space (or inodes: df -i) in ", dir, " or lower ", "ddp::CheckpointOptions::keepLast");
}

// The file's order of samples must be this run's, or the resumed epoch would continue at a position
// of another permutation. Every rank read the same file (checked above): all throw alike.
void checkSampleOrder(const CheckpointOptions& options, const checkpoint::TrainingState& state,
                      const std::string& path) {
  const std::string why = ": the resumed epoch's order would change, repeating some of its samples and skipping "
                          "others; resume with the file's value, or start afresh with another checkpoint directory";
  if (static_cast<uint64_t>(state.seed) != options.seed) {
    DDP_THROW(ConfigError, "resume: '", path, "' was written with seed ", static_cast<uint64_t>(state.seed),
              ", this run has seed ", options.seed, why);
  }
  for (const auto& [name, value] : options.sampleOrder) {
    const auto saved = state.sampleOrder.find(name);
    if (saved != state.sampleOrder.end() && saved->second != value) {
      DDP_THROW(ConfigError, "resume: '", path, "' was written with ", name, "=", saved->second, ", this run has ",
                name, "=", value, why);
    }
  }
}

// The checkpoint at `path` ("" on every rank: none), read by every rank: all read it, or all
// throw. A sharded checkpoint (a directory) or one file, shaped for `module`: the rows of its fully
// sharded parameters, whatever world size wrote it (each rank reads the files it needs).
checkpoint::TrainingState readAgreed(ProcessGroup& group, const std::string& path, const torch::nn::Module& module) {
  checkpoint::TrainingState state;
  std::string error;
  bool damaged = false;  // its files, as against a model it does not fit
  if (!path.empty()) {
    try {
      state = checkpoint::loadTrainingStateFor(path, &module);
    } catch (const checkpoint::DamagedCheckpoint& e) {
      error = e.what();
      damaged = true;
    } catch (const Error& e) {
      error = e.what();
    } catch (const std::exception& e) {  // LibTorch's or the JSON reader's: still one agreed line
      const std::string what = e.what();
      error = "resume: cannot load '" + path + "': " + what.substr(0, what.find('\n'));
    }
  }
  const int64_t step = path.empty() ? -1 : state.globalStep;
  // Every rank must continue from the same step, or the collectives mismatch; a rank that could not
  // read its part fails them all.
  const int64_t failed = error.empty() ? 0 : 1;
  at::Tensor steps = at::tensor({step, int64_t{1}, failed, damaged ? failed : 0}, at::kLong).to(group.collectiveDevice());
  group.allReduce(steps);
  steps = steps.cpu();
  // Damaged files on every rank that failed: resume() may go on to an older checkpoint, all ranks alike.
  const bool allDamaged = steps[2].item<int64_t>() == steps[3].item<int64_t>();
  if (!error.empty()) {
    if (allDamaged) throw checkpoint::DamagedCheckpoint(error);
    throw CheckpointError(error);
  }
  if (steps[2].item<int64_t>() > 0) {
    const std::string why = "resume: another rank could not read '" + path + "' (its log says why)";
    if (allDamaged) throw checkpoint::DamagedCheckpoint(why);
    throw CheckpointError(why);
  }
  if (steps[0].item<int64_t>() != step * steps[1].item<int64_t>()) {
    DDP_THROW(CommError, "resume: ranks found different checkpoints (rank ", group.rank(), " has step ", step,
              " from '", path.empty() ? "<none>" : path, "'); point every rank at the same ", "ddp::CheckpointOptions::dir");
  }
  return state;
}

}  // namespace

void saveModel(const torch::nn::Module& module, const std::string& path) {
  if (checkpoint::holdsShardedParameters(module)) {
    DDP_THROW(ConfigError, "ddp::saveModel('", path, "'): the module has ddp::fullyShard units, whose parameters "
              "each rank holds some rows of; call ddp::saveModel(module, path, group) on every rank, which gathers "
              "them (or call ddp::fullStateDict(module) on every rank and save it from rank 0)");
  }
  saveStateDict(stateDict(module), path);
}

void saveModel(const torch::nn::Module& module, const std::string& path, ProcessGroup& group) {
  // A fully sharded model's parameters, whole: gathered from every rank's rows (collective).
  std::optional<StateDict> full;
  if (checkpoint::holdsShardedParameters(module)) full = fullStateDict(module);
  // Rank 0's failure must reach every rank, or the others would wait in the barrier for ever.
  std::string error;
  if (group.rank() == 0) {
    try {
      if (full) {
        saveStateDict(*full, path);
      } else {
        saveModel(module, path);
      }
    } catch (const Error& e) {
      error = e.what();
    }
  }
  at::Tensor failed = at::tensor({error.empty() ? 0.0 : 1.0});
  group.withLabel("saveModel").allReduce(failed);
  if (!error.empty()) DDP_THROW(CheckpointError, error);
  if (failed.item<double>() > 0) DDP_THROW(CheckpointError, "rank 0 could not write '", path, "' (its log says why)");
}

void loadModel(torch::nn::Module& module, const std::string& path) { checkpoint::loadModelFile(module, path); }

std::vector<std::string> listCheckpoints(const std::string& dir) { return checkpoint::listCheckpoints(dir); }

void consolidateCheckpoint(const std::string& shardedPath, const std::string& outPath) {
  if (!checkpoint::isShardedCheckpoint(shardedPath)) {
    DDP_THROW(ConfigError, "ddp::consolidateCheckpoint: '", shardedPath,
              "' is not a sharded checkpoint's directory (a one-file checkpoint is whole already)");
  }
  checkpoint::saveTrainingCheckpoint(checkpoint::loadTrainingStateFor(shardedPath, nullptr), outPath);
}

Checkpointer::Checkpointer(ProcessGroup group, CheckpointOptions options)
    : group_(std::move(group)), options_(std::move(options)) {
  if (options_.dir.empty()) DDP_THROW(ConfigError, "ddp::CheckpointOptions::dir", " is empty; name a directory for the checkpoints");
  if (options_.keepLast < 0) DDP_THROW(ConfigError, "ddp::CheckpointOptions::keepLast", " must be >= 0 (0 keeps all)");
}

std::string Checkpointer::save(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                               const TrainPosition& position, const GradScaler* scaler) {
  internal::checkLive(group_, "Checkpointer::save");
  ProcessGroup group = group_.withLabel("Checkpointer::save");
  const std::string& dir = options_.dir;
  // A fully sharded model's checkpoint is sharded: a directory, each rank writing its rows.
  const bool shardedModel = checkpoint::holdsShardedParameters(module);
  const std::string path = shardedModel ? checkpoint::shardedCheckpointPath(dir, position.globalStep)
                                        : checkpoint::checkpointPath(dir, position.globalStep);
  if (position.globalStep == lastSavedStep_) {
    // This very step is on disk already (a stop's save after a periodic one). The same step at
    // another position is a loop that does not count its steps: its saves would all be one file.
    if (lastSavedPosition_ && !samePosition(*lastSavedPosition_, position)) {
      DDP_THROW(ConfigError, "ddp::Checkpointer::save: ", describePosition(*lastSavedPosition_),
                " is saved already, and this save is at global step ", position.globalStep, " again but at another ",
                "position (", describePosition(position), ", ", position.samples, " samples): resume takes the ",
                "highest step, one checkpoint per step; count TrainPosition::globalStep up with every optimizer step");
    }
    return path;
  }
  // Collective: another job's lock (taken on the first save), another rank's step, or a step below
  // this run's newest checkpoint there fails every rank.
  holdDirectory(group, /*create=*/true, position.globalStep);
  if (shardedModel && dynamic_cast<ZeroRedundancyOptimizer*>(&optimizer) != nullptr) {
    DDP_THROW(ConfigError, "ddp::Checkpointer::save: a ZeroRedundancyOptimizer over fully sharded parameters; "
              "fully sharded parameters are sharded already: step them with the optimizer itself");
  }
  // Read on every rank (a collective-free read of the scale, which waits for the device).
  if (scaler != nullptr && group.rank() != 0) (void)scaler->stateDict();
  const std::vector<at::Tensor> cpuRng = gatherCpuRngStates(group);  // collective: before rank 0 writes
  std::vector<at::Tensor> cudaRng;
  if (options_.cudaGenerators.empty()) {
    cudaRng = gatherCudaRngStates(group, group_.device());  // collective: before rank 0 writes
  } else {
    cudaRng = ownCudaRngStates(group, options_.cudaGenerators);
  }
  // ZeRO: the shards of the optimizer state, from every rank (collective).
  std::optional<checkpoint::NamedTensors> sharded;
  if (auto* zero = dynamic_cast<ZeroRedundancyOptimizer*>(&optimizer)) sharded = checkpoint::gatherShardedState(group, *zero, module);
  if (shardedModel) {
    const checkpoint::TrainingState state = trainingState(module, optimizer, sharded, position, group.size(), options_,
                                                                cpuRng, cudaRng, scaler);
    for (const auto& [key, value] : state.optimizer) {
      if (key == checkpoint::kArchiveKey) {  // the same on every rank: all throw
        DDP_THROW(ConfigError, "ddp::Checkpointer::save: a fully sharded model's checkpoint holds its optimizer state "
                  "by parameter name, which needs SGD, Adam, AdamW or ddp::FusedAdamW");
      }
    }
    try {
      checkpoint::saveShardedCheckpoint(group, state, module, dir);  // collective, agreed
    } catch (const CheckpointError& e) {
      rethrowSaveError(e, dir, options_.keepLast);
    }
    if (group.rank() == 0) {
      prune(path);
      spdlog::info("checkpoint {} ({} ranks' shards; {})", path, group.size(), describePosition(position));
    }
    lastSavedStep_ = position.globalStep;
    lastSavedPosition_ = position;
    return path;
  }
  std::string error;
  if (group.rank() == 0) {
    try {
      makeDirectories(dir, "ddp::CheckpointOptions::dir");
      const checkpoint::TrainingState state = trainingState(module, optimizer, sharded, position, group.size(), options_,
                                                                cpuRng, cudaRng, scaler);
      try {
        checkpoint::saveTrainingCheckpoint(state, path);
      } catch (const CheckpointError& e) {
        rethrowSaveError(e, dir, options_.keepLast);
      }
      prune(path);
      spdlog::info("checkpoint {} ({})", path, describePosition(position));
    } catch (const Error& e) {
      error = e.what();
    }
  }
  // No rank runs ahead of a save; a failed save fails every rank (none waits for ever).
  at::Tensor failed = at::tensor({error.empty() ? 0.0 : 1.0}).to(group.collectiveDevice());
  group.allReduce(failed);
  if (!error.empty()) throw CheckpointError(error);
  if (failed.item<double>() > 0) DDP_THROW(CheckpointError, "rank 0 could not write checkpoint '", path, "' (its log says why)");
  lastSavedStep_ = position.globalStep;
  lastSavedPosition_ = position;
  return path;
}

std::optional<TrainPosition> Checkpointer::resume(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                                 GradScaler* scaler) {
  // Every checkpoint looked past, newest first: not looked at (nor warned about) again when a
  // later one turns out damaged too.
  std::vector<std::string> skipped;
  internal::checkLive(group_, "Checkpointer::resume");
  ProcessGroup group = group_.withLabel("Checkpointer::resume");
  holdDirectory(group, /*create=*/false, -1);  // collective: a job saving there could prune what this one reads
  for (;;) {
    const auto found = checkpoint::latestValidCheckpoint(
        options_.dir,
        [&](const std::string& p, const std::string& why) {
          skipped.push_back(p);
          if (group_.rank() == 0) spdlog::warn("resume: skipping {}: {}", p, why);
        },
        skipped, checkpoint::OneFileCheck::kByItsReader);  // read once, by readAgreed
    if (!found) {
      // Every rank must agree that there is nothing, or some would resume and some not.
      resumeFrom("", module, optimizer, scaler);
      if (!skipped.empty()) {
        // Damaged, all of them: starting from the beginning would train again what they hold, and
        // its saves would sit among them. Nothing is loaded or removed; the user decides.
        DDP_THROW(CheckpointsDamagedError, "resume: every checkpoint in ", options_.dir, " is damaged (", skipped.size(),
                  ", the newest ", skipped.front(), "; the warnings above say why): none was loaded; move them out of ",
                  "ddp::CheckpointOptions::dir", " to start from the beginning, or repair the newest");
      }
      if (group_.rank() == 0) spdlog::info("resume: no checkpoint in {}; starting from the beginning", options_.dir);
      return std::nullopt;
    }
    try {
      return resumeFrom(*found, module, optimizer, scaler);
    } catch (const checkpoint::DamagedCheckpoint& e) {
      // Agreed by every rank before anything was loaded: each says what it saw, and all go on.
      spdlog::warn("resume: skipping {}: {}", *found, e.what());
      skipped.push_back(*found);
    }
  }
}

TrainPosition Checkpointer::resumeFrom(const std::string& path, torch::nn::Module& module,
                                       torch::optim::Optimizer& optimizer, GradScaler* scaler) {
  internal::checkLive(group_, "Checkpointer::resume");
  ProcessGroup group = group_.withLabel("Checkpointer::resume");
  checkpoint::TrainingState state = readAgreed(group, path, module);
  if (path.empty()) return {};
  // Another model's checkpoint is named as such before its seed or sample order would differ too.
  checkpoint::checkStateDictFits(module, state.model, path);
  checkSampleOrder(options_, state, path);
  if (options_.checkRecordedConfig) options_.checkRecordedConfig(state.config, path);

  const c10::Device device = group_.device();
  checkpoint::loadStateDictInto(module, state.model, path);
  checkpoint::restoreOptimizerState(optimizer, module, state.optimizer, path, device);
  if (scaler != nullptr && scaler->isEnabled()) {
    if (state.scaler) {
      const auto& st = *state.scaler;
      scaler->loadStateDict(GradScalerState{st.scale, st.growthFactor, st.backoffFactor, st.growthInterval,
                                            st.growthTracker});
    } else if (group.rank() == 0) {
      spdlog::warn("resume: {} holds no loss-scaler state (written without fp16); the scaler starts at scale {}",
                   path, scaler->getScale());
    }
  }
  // This rank's own CPU generator (a file without the other ranks' states, or of fewer ranks than
  // this job: rank 0's, as every rank of a job seeded alike holds).
  const auto rank = static_cast<size_t>(group.rank());
  checkpoint::setCpuRngState(rank >= 1 && rank <= state.cpuRngRanks.size() ? state.cpuRngRanks[rank - 1] : state.cpuRng);
  if (!options_.cudaGenerators.empty()) {
    (void)ownCudaRngStates(group, {});  // the one-process check
    const auto& devices = options_.cudaGenerators;
    for (size_t i = 0; i < devices.size(); ++i) {
      if (!devices[i].is_cuda()) continue;
      if (i < state.cudaRng.size() && state.cudaRng[i].numel() > 0) {
        checkpoint::setCudaRngState(devices[i], state.cudaRng[i]);  // replica i's generator
      } else {
        spdlog::warn("resume: {} holds no CUDA generator state for {} (replica {}); it keeps the seed", path,
                     devices[i].str(), i);
      }
    }
  } else if (device.is_cuda() && rank < state.cudaRng.size()) {
    checkpoint::setCudaRngState(device, state.cudaRng[rank]);  // this rank's own generator
  } else if (device.is_cuda()) {
    spdlog::warn("resume: {} holds no CUDA generator state for rank {}; its GPU generator keeps the seed", path,
                 group.rank());
  }
  TrainPosition position{state.epoch, state.stepInEpoch, state.globalStep, state.samples,
                         state.epochSamples.value_or(-1), state.microSteps.value_or(-1)};
  resumedConfig_ = std::move(state.config);
  if (state.worldSize != group.size() && position.epochSamples >= 0) {
    // The position is global (positions of the epoch's permutation): the new world continues it.
    if (group.rank() == 0) {
      spdlog::info("resume: {} was written by {} ranks, this job has {}; {} continues after the {} samples of "
                   "its permutation already seen, dealt out over the {} ranks",
                   path, state.worldSize, group.size(), nthEpoch(state.epoch), position.epochSamples, group.size());
    }
  } else if (state.worldSize != group.size()) {
    // An older checkpoint: the shards depend on the world size, so the saved step means nothing now.
    if (group.rank() == 0) {
      spdlog::warn("resume: {} was written by {} ranks, this job has {}, and holds no global sample position "
                   "(TrainPosition::epochSamples was -1 when it was saved, or the file predates it): restarting "
                   "{} from its first batch",
                   path, state.worldSize, group.size(), nthEpoch(state.epoch));
    }
    position.stepInEpoch = 0;
  }
  // The checkpoints up to this one in options_.dir are this run's history: keepLast prunes them,
  // and the saves go on from its step. (A file elsewhere, e.g. to fine-tune from: neither.)
  std::error_code ec;
  const auto parent = std::filesystem::weakly_canonical(std::filesystem::path(path).parent_path(), ec);
  if (!ec && parent == std::filesystem::weakly_canonical(options_.dir, ec) && !ec) {
    lastSavedStep_ = position.globalStep;
    lastSavedPosition_.reset();  // a save there at this step: this world's view of the same position
    checkpoint::recordResume(options_.dir, position.globalStep);
  }
  if (group.rank() == 0) {
    spdlog::info("resumed from {} at {}", path, describePosition(position));
  }
  return position;
}

}  // namespace ddp
