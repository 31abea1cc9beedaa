// ddp::saveModel / loadModel (the rank-0 export) and ddp::Checkpointer (training checkpoints).
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <spdlog/spdlog.h>
#include <torch/nn/module.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>

#include "libddp/internal.h"
#include "common/error.h"
#include "ddp/ddp.h"
#include "ddp/fused_optim.h"
#include "ddp/files.h"
#include "libddp/checkpoint/checkpoint_dir.h"
#include "libddp/checkpoint/optimizer_state.h"
#include "libddp/checkpoint/sharded_checkpoint.h"
#include "libddp/checkpoint/state_dict_loader.h"
#include "libddp/checkpoint/training_checkpoint.h"
#include "ddp/state_dict.h"

namespace ddp {
namespace {

// Optimizers other than SGD travel as their own torch::serialize archive in one uint8 tensor.
constexpr const char* kArchiveKey = "torch_archive";

checkpoint::NamedTensors namedParameters(const torch::nn::Module& module) {
  checkpoint::NamedTensors out;
  for (const auto& item : module.named_parameters(true)) out.emplace_back(item.key(), item.value());
  return out;
}

// ddp::FusedAdamW's state under Adam's keys ("exp_avg.<name>", ..., "step.<name>" as int64): a
// checkpoint of AdamW resumes into FusedAdamW and back.
checkpoint::NamedTensors fusedAdamState(const FusedAdamW& optimizer, const torch::nn::Module& module) {
  checkpoint::NamedTensors out;
  for (const auto& [name, param] : namedParameters(module)) {
    const FusedAdamWState* st = optimizer.stateOf(param);
    if (st == nullptr) continue;
    out.emplace_back("exp_avg." + name, st->expAvg.detach().cpu().clone());
    out.emplace_back("exp_avg_sq." + name, st->expAvgSq.detach().cpu().clone());
    if (st->maxExpAvgSq.defined()) out.emplace_back("max_exp_avg_sq." + name, st->maxExpAvgSq.detach().cpu().clone());
    out.emplace_back("step." + name, at::scalar_tensor(static_cast<int64_t>(st->step.item<float>()), at::kLong));
  }
  return out;
}

void restoreFusedAdamState(FusedAdamW& optimizer, const torch::nn::Module& module, const checkpoint::NamedTensors& saved,
                           const std::string& path) {
  std::map<std::string, std::map<std::string, at::Tensor>> perParam;  // name → prefix → tensor
  const auto params = namedParameters(module);
  std::map<std::string, at::Tensor> byName(params.begin(), params.end());
  for (const auto& [key, value] : saved) {
    bool known = false;
    for (const char* prefix : {"exp_avg.", "exp_avg_sq.", "max_exp_avg_sq.", "step."}) {
      if (key.rfind(prefix, 0) != 0) continue;
      const std::string name = key.substr(std::string(prefix).size());
      if (byName.count(name) == 0) {
        DDP_THROW(CheckpointError, "'", path, "' has optimizer state for unknown parameter '", name, "'");
      }
      perParam[name][prefix] = value;
      known = true;
      break;
    }
    if (!known) {
      DDP_THROW(CheckpointError, path, " holds state of another optimizer than Adam/AdamW ('", key,
                "'); resume with the optimizer that wrote it");
    }
  }
  for (auto& [name, entries] : perParam) {
    const at::Tensor& param = byName.at(name);
    for (const char* required : {"exp_avg.", "exp_avg_sq.", "step."}) {
      if (entries.count(required) == 0) {
        DDP_THROW(CheckpointError, "'", path, "' has incomplete Adam state for '", name, "' (no ", required, name, ")");
      }
    }
    for (const char* moment : {"exp_avg.", "exp_avg_sq.", "max_exp_avg_sq."}) {
      if (entries.count(moment) && !entries[moment].sizes().equals(param.sizes())) {
        DDP_THROW(CheckpointError, "'", path, "' has Adam state of the wrong shape for '", name, "'");
      }
    }
    FusedAdamWState st;
    st.expAvg = entries["exp_avg."].to(param.device(), param.scalar_type()).clone();
    st.expAvgSq = entries["exp_avg_sq."].to(param.device(), param.scalar_type()).clone();
    if (entries.count("max_exp_avg_sq.")) {
      st.maxExpAvgSq = entries["max_exp_avg_sq."].to(param.device(), param.scalar_type()).clone();
    }
    st.step = entries["step."].to(param.device(), at::kFloat).reshape({}).clone();
    optimizer.setStateOf(param, std::move(st));
  }
}

checkpoint::NamedTensors optimizerState(torch::optim::Optimizer& optimizer, const torch::nn::Module& module) {
  if (const auto* fused = dynamic_cast<const FusedAdamW*>(&optimizer)) return fusedAdamState(*fused, module);
  if (auto* sgd = dynamic_cast<torch::optim::SGD*>(&optimizer)) {
    return checkpoint::sgdMomentumBuffers(*sgd, namedParameters(module));  // readable by name in Python
  }
  if (checkpoint::isAdam(optimizer)) return checkpoint::adamMoments(optimizer, namedParameters(module));
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  const std::string data = bytes.str();
  at::Tensor blob = at::empty({static_cast<int64_t>(data.size())}, at::kByte);
  std::memcpy(blob.data_ptr(), data.data(), data.size());
  return {{kArchiveKey, blob}};
}

// ZeroRedundancyOptimizer: every rank's shard of the state by name (its local optimizer's entries,
// the unsharded optimizer's names), broadcast by each rank in turn: names, then dtype and shape per
// entry, then the tensors. Collective; every rank ends with the whole state (rank 0 writes it).
checkpoint::NamedTensors gatherShardedState(ProcessGroup& group, ZeroRedundancyOptimizer& zero,
                                            const torch::nn::Module& module) {
  torch::optim::Optimizer& local = zero.localOptimizer();
  if (dynamic_cast<torch::optim::SGD*>(&local) == nullptr && !checkpoint::isAdam(local)) {
    DDP_THROW(ConfigError, "ddp::Checkpointer: a ZeroRedundancyOptimizer's checkpoint needs SGD, Adam or AdamW as its "
              "optimizer class (their state is saved by name)");
  }
  const checkpoint::NamedTensors mine = optimizerState(local, module);
  checkpoint::NamedTensors all;
  const auto on = at::TensorOptions().device(group.collectiveDevice());
  for (int r = 0; r < group.size(); ++r) {
    const bool sender = group.rank() == r;
    std::string names;
    std::vector<int64_t> meta;
    if (sender) {
      for (const auto& [key, t] : mine) {
        names += key + '\n';
        meta.push_back(static_cast<int64_t>(t.scalar_type()));
        meta.push_back(t.dim());
        for (int64_t d : t.sizes()) meta.push_back(d);
      }
    }
    at::Tensor sizes = at::tensor({static_cast<int64_t>(names.size()), static_cast<int64_t>(meta.size())}, at::kLong).to(group.collectiveDevice());
    group.broadcast(sizes, r);
    sizes = sizes.cpu();
    at::Tensor nameBytes = at::zeros({sizes[0].item<int64_t>()}, at::kByte);
    at::Tensor metaValues = at::zeros({sizes[1].item<int64_t>()}, at::kLong);
    if (sender) {
      std::memcpy(nameBytes.data_ptr(), names.data(), names.size());
      std::memcpy(metaValues.data_ptr(), meta.data(), meta.size() * sizeof(int64_t));
    }
    nameBytes = nameBytes.to(group.collectiveDevice());
    metaValues = metaValues.to(group.collectiveDevice());
    group.broadcast(nameBytes, r);
    group.broadcast(metaValues, r);
    nameBytes = nameBytes.cpu();
    metaValues = metaValues.cpu();
    const std::string text(static_cast<const char*>(nameBytes.data_ptr()), static_cast<size_t>(nameBytes.numel()));
    const int64_t* m = metaValues.data_ptr<int64_t>();
    size_t at = 0, pos = 0;
    for (size_t entry = 0; pos < text.size(); ++entry) {
      const size_t end = text.find('\n', pos);
      const std::string key = text.substr(pos, end - pos);
      pos = end + 1;
      const auto dtype = static_cast<at::ScalarType>(m[at++]);
      const int64_t dims = m[at++];
      std::vector<int64_t> shape(m + at, m + at + dims);
      at += static_cast<size_t>(dims);
      at::Tensor t = sender ? mine[entry].second.contiguous().to(group.collectiveDevice())
                            : at::empty(shape, on.dtype(dtype));
      group.broadcast(t, r);
      all.emplace_back(key, t.cpu());
    }
  }
  return all;
}

// The entries of `saved` for the parameters this rank owns, and those parameters by name.
void restoreShardedState(ZeroRedundancyOptimizer& zero, const torch::nn::Module& module,
                         const checkpoint::NamedTensors& saved, const std::string& path, c10::Device device);

void restoreOptimizerState(torch::optim::Optimizer& optimizer, const torch::nn::Module& module,
                           const checkpoint::NamedTensors& saved, const std::string& path, c10::Device device) {
  if (auto* zero = dynamic_cast<ZeroRedundancyOptimizer*>(&optimizer)) {
    restoreShardedState(*zero, module, saved, path, device);
    return;
  }
  if (auto* fused = dynamic_cast<FusedAdamW*>(&optimizer)) {
    restoreFusedAdamState(*fused, module, saved, path);
    return;
  }
  if (auto* sgd = dynamic_cast<torch::optim::SGD*>(&optimizer)) {
    for (const auto& [key, value] : saved) {
      if (key == kArchiveKey) {
        DDP_THROW(CheckpointError, path, " holds the state of another optimizer than SGD; resume with the "
                  "optimizer that wrote it");
      }
    }
    if (checkpoint::holdsAdamMoments(saved)) {
      DDP_THROW(CheckpointError, path, " holds Adam/AdamW state, but this optimizer is SGD; resume with the "
                "optimizer that wrote it");
    }
    checkpoint::restoreSgdMomentumBuffers(*sgd, namedParameters(module), saved, path);
    return;
  }
  if (checkpoint::isAdam(optimizer) && !saved.empty() && saved.front().first != kArchiveKey) {
    if (!checkpoint::holdsAdamMoments(saved)) {
      DDP_THROW(CheckpointError, path, " holds SGD momentum buffers, but this optimizer is Adam/AdamW; resume "
                "with the optimizer that wrote it");
    }
    checkpoint::restoreAdamMoments(optimizer, namedParameters(module), saved, path);
    return;
  }
  for (const auto& [key, value] : saved) {
    if (key != kArchiveKey) continue;
    const at::Tensor blob = value.contiguous();
    std::istringstream bytes(std::string(static_cast<const char*>(blob.data_ptr()), static_cast<size_t>(blob.numel())));
    torch::serialize::InputArchive archive;
    archive.load_from(bytes, device);
    try {
      optimizer.load(archive);
    } catch (const c10::Error& e) {
      const std::string what = e.what_without_backtrace();
      DDP_THROW(CheckpointError, path, ": its optimizer state does not fit this optimizer (",
                what.substr(0, what.find('\n')), "); resume with the optimizer and model that wrote it");
    }
    return;
  }
  if (!saved.empty()) {
    DDP_THROW(CheckpointError, path, " holds SGD momentum buffers, but this optimizer is not SGD; resume with "
              "the optimizer that wrote it");
  }
}

void restoreShardedState(ZeroRedundancyOptimizer& zero, const torch::nn::Module& module,
                         const checkpoint::NamedTensors& saved, const std::string& path, c10::Device device) {
  checkpoint::NamedTensors owned;
  std::map<std::string, bool> mine;
  for (const auto& item : module.named_parameters(true)) {
    if (zero.owns(item.value())) {
      owned.emplace_back(item.key(), item.value());
      mine[item.key()] = true;
    }
  }
  checkpoint::NamedTensors entries;
  for (const auto& [key, value] : saved) {
    const size_t dot = key.find('.');
    if (dot != std::string::npos && mine.count(key.substr(dot + 1))) entries.emplace_back(key, value);
  }
  torch::optim::Optimizer& local = zero.localOptimizer();
  if (auto* sgd = dynamic_cast<torch::optim::SGD*>(&local)) {
    if (checkpoint::holdsAdamMoments(saved)) {
      DDP_THROW(CheckpointError, path, " holds Adam/AdamW state, but this optimizer is SGD; resume with the "
                "optimizer that wrote it");
    }
    checkpoint::restoreSgdMomentumBuffers(*sgd, owned, entries, path);
  } else if (checkpoint::isAdam(local)) {
    if (!entries.empty() && !checkpoint::holdsAdamMoments(entries)) {
      DDP_THROW(CheckpointError, path, " holds SGD momentum buffers, but this optimizer is Adam/AdamW; resume "
                "with the optimizer that wrote it");
    }
    checkpoint::restoreAdamMoments(local, owned, entries, path);
  } else {
    DDP_THROW(ConfigError, "ddp::Checkpointer: a ZeroRedundancyOptimizer resumes SGD, Adam or AdamW state only");
  }
  (void)device;
}

// What a checkpoint holds of this rank: its model and optimizer entries (ZeRO's gathered shards
// when given), the position, the generators and the scaler.
checkpoint::TrainingState trainingState(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                        std::optional<checkpoint::NamedTensors>& sharded, const TrainPosition& position,
                                        int worldSize, const CheckpointOptions& options,
                                        const std::vector<at::Tensor>& cudaRng, const GradScaler* scaler) {
  checkpoint::TrainingState state;
  for (auto& [key, tensor] : stateDict(module)) state.model.emplace_back(key, tensor);
  state.optimizer = sharded ? std::move(*sharded) : optimizerState(optimizer, module);
  state.epoch = position.epoch;
  state.stepInEpoch = position.stepInEpoch;
  state.globalStep = position.globalStep;
  state.samples = position.samples;
  state.worldSize = worldSize;
  if (position.epochSamples >= 0) state.epochSamples = position.epochSamples;
  state.seed = static_cast<int64_t>(options.seed);
  state.sampleOrder = options.sampleOrder;
  state.cpuRng = checkpoint::cpuRngState();
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

// Rank r fills row r only, so a SUM all-reduce is a gather.
std::vector<at::Tensor> gatherCudaRngStates(ProcessGroup& group, c10::Device device) {
  const at::Tensor mine = checkpoint::cudaRngState(device);
  if (!mine.defined()) return {};
  at::Tensor rows = at::zeros({group.size(), mine.numel()}, at::kLong);
  rows[group.rank()].copy_(mine);
  rows = rows.to(group.collectiveDevice());
  group.allReduce(rows);
  rows = rows.cpu();
  std::vector<at::Tensor> out;
  for (int r = 0; r < group.size(); ++r) out.push_back(rows[r].to(at::kByte).clone());
  return out;
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

}  // namespace

void saveModel(const torch::nn::Module& module, const std::string& path) {
  saveStateDict(stateDict(module), path);
}

void saveModel(const torch::nn::Module& module, const std::string& path, ProcessGroup& group) {
  // Rank 0's failure must reach every rank, or the others would wait in the barrier for ever.
  std::string error;
  if (group.rank() == 0) {
    try {
      saveModel(module, path);
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
  if (position.globalStep == lastSavedStep_) return path;  // this very step is on disk already
  if (shardedModel && dynamic_cast<ZeroRedundancyOptimizer*>(&optimizer) != nullptr) {
    DDP_THROW(ConfigError, "ddp::Checkpointer::save: a ZeroRedundancyOptimizer over fully sharded parameters; "
              "fully sharded parameters are sharded already: step them with the optimizer itself");
  }
  // Read on every rank (a collective-free read of the scale, which waits for the device).
  if (scaler != nullptr && group.rank() != 0) (void)scaler->stateDict();
  std::vector<at::Tensor> cudaRng;
  if (options_.cudaGenerators.empty()) {
    cudaRng = gatherCudaRngStates(group, group_.device());  // collective: before rank 0 writes
  } else {
    cudaRng = ownCudaRngStates(group, options_.cudaGenerators);
  }
  // ZeRO: the shards of the optimizer state, from every rank (collective).
  std::optional<checkpoint::NamedTensors> sharded;
  if (auto* zero = dynamic_cast<ZeroRedundancyOptimizer*>(&optimizer)) sharded = gatherShardedState(group, *zero, module);
  if (shardedModel) {
    const checkpoint::TrainingState state = trainingState(module, optimizer, sharded, position, group.size(), options_,
                                                                cudaRng, scaler);
    for (const auto& [key, value] : state.optimizer) {
      if (key == kArchiveKey) {  // the same on every rank: all throw
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
      checkpoint::pruneCheckpoints(dir, options_.keepLast);
      spdlog::info("checkpoint {} ({} ranks' shards; epoch {} step {})", path, group.size(), position.epoch,
                   position.stepInEpoch);
    }
    lastSavedStep_ = position.globalStep;
    return path;
  }
  std::string error;
  if (group.rank() == 0) {
    try {
      makeDirectories(dir, "ddp::CheckpointOptions::dir");
      const checkpoint::TrainingState state = trainingState(module, optimizer, sharded, position, group.size(), options_,
                                                                cudaRng, scaler);
      try {
        checkpoint::saveTrainingCheckpoint(state, path);
      } catch (const CheckpointError& e) {
        rethrowSaveError(e, dir, options_.keepLast);
      }
      checkpoint::pruneCheckpoints(dir, options_.keepLast);
      spdlog::info("checkpoint {} (epoch {} step {})", path, position.epoch, position.stepInEpoch);
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
  return path;
}

std::optional<TrainPosition> Checkpointer::resume(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                                 GradScaler* scaler) {
  const auto found = checkpoint::latestValidCheckpoint(options_.dir, [&](const std::string& p, const std::string& why) {
    if (group_.rank() == 0) spdlog::warn("resume: skipping {}: {}", p, why);
  });
  if (!found) {
    // Every rank must agree that there is nothing, or some would resume and some not.
    resumeFrom("", module, optimizer, scaler);
    if (group_.rank() == 0) spdlog::info("resume: no checkpoint in {}; starting from the beginning", options_.dir);
    return std::nullopt;
  }
  return resumeFrom(*found, module, optimizer, scaler);
}

TrainPosition Checkpointer::resumeFrom(const std::string& path, torch::nn::Module& module,
                                       torch::optim::Optimizer& optimizer, GradScaler* scaler) {
  internal::checkLive(group_, "Checkpointer::resume");
  ProcessGroup group = group_.withLabel("Checkpointer::resume");
  // A sharded checkpoint (a directory) or one file, shaped for this module: the rows of its fully
  // sharded parameters, whatever world size wrote it (each rank reads the files it needs).
  checkpoint::TrainingState state;
  std::string error;
  if (!path.empty()) {
    try {
      state = checkpoint::loadTrainingStateFor(path, &module);
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
  at::Tensor steps = at::tensor({step, int64_t{1}, error.empty() ? int64_t{0} : int64_t{1}}, at::kLong)
                         .to(group.collectiveDevice());
  group.allReduce(steps);
  steps = steps.cpu();
  if (!error.empty()) throw CheckpointError(error);
  if (steps[2].item<int64_t>() > 0) {
    DDP_THROW(CheckpointError, "resume: another rank could not read '", path, "' (its log says why)");
  }
  if (steps[0].item<int64_t>() != step * steps[1].item<int64_t>()) {
    DDP_THROW(CommError, "resume: ranks found different checkpoints (rank ", group.rank(), " has step ", step,
              " from '", path.empty() ? "<none>" : path, "'); point every rank at the same ", "ddp::CheckpointOptions::dir");
  }
  if (path.empty()) return {};
  checkSampleOrder(options_, state, path);

  const c10::Device device = group_.device();
  checkpoint::loadStateDictInto(module, state.model, path);
  restoreOptimizerState(optimizer, module, state.optimizer, path, device);
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
  checkpoint::setCpuRngState(state.cpuRng);
  const auto rank = static_cast<size_t>(group.rank());
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
                         state.epochSamples.value_or(-1)};
  if (state.worldSize != group.size() && position.epochSamples >= 0) {
    // The position is global (positions of the epoch's permutation): the new world continues it.
    if (group.rank() == 0) {
      spdlog::info("resume: {} was written by {} ranks, this job has {}; epoch {} continues after the {} samples of "
                   "its permutation already seen, dealt out over the {} ranks",
                   path, state.worldSize, group.size(), state.epoch, position.epochSamples, group.size());
    }
  } else if (state.worldSize != group.size()) {
    // An older checkpoint: the shards depend on the world size, so the saved step means nothing now.
    if (group.rank() == 0) {
      spdlog::warn("resume: {} was written by {} ranks, this job has {}, and predates global sample positions; "
                   "restarting epoch {} from its first batch",
                   path, state.worldSize, group.size(), state.epoch);
    }
    position.stepInEpoch = 0;
  }
  lastSavedStep_ = position.globalStep;
  if (group.rank() == 0) {
    spdlog::info("resumed from {} at epoch {} step {} (global step {})", path, position.epoch, position.stepInEpoch,
                 position.globalStep);
  }
  return position;
}

}  // namespace ddp
