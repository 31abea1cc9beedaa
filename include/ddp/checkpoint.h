// Exported models (ddp::saveModel / ddp::loadModel, files Python's torch.load reads) and training
// checkpoints for exact resume (ddp::Checkpointer).
#pragma once

#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ddp/grad_scaler.h"
#include "ddp/process_group.h"

namespace ddp {

/// The module's parameters and buffers as Python's module.state_dict(): plain keys (any leading
/// "module." removed), CPU tensors, in torch.save's zip format (Python: torch.load(path), any
/// device). Written atomically. With a group: rank 0 writes and every rank returns after it; a
/// model with ddp::fullyShard units is gathered first (ddp::fullStateDict: every rank must call
/// it), which the overload without a group refuses (ConfigError).
void saveModel(const torch::nn::Module& module, const std::string& path);
void saveModel(const torch::nn::Module& module, const std::string& path, ProcessGroup& group);
/// Loads a state_dict (ours or Python's torch.save, keys with or without "module.", tensors saved
/// on any device) into `module`, converted to its devices. One CheckpointError lists every missing,
/// unexpected or misshaped key before anything changes.
void loadModel(torch::nn::Module& module, const std::string& path);

/// Where training stands; the next step is step `stepInEpoch` of `epoch`.
struct TrainPosition {
  int64_t epoch = 0;
  int64_t stepInEpoch = 0;  // optimizer steps already done in `epoch`
  int64_t globalStep = 0;   // optimizer steps done in total
  int64_t samples = 0;      // samples consumed, all ranks
  /// Positions of `epoch`'s permutation consumed, all ranks (padding included): a resume at any
  /// world size continues with the next one (DistributedSampler::setEpoch(epoch, epochSamples)).
  /// -1: not known (a checkpoint written before it existed); then only the same world size
  /// resumes in the epoch, another restarts it.
  int64_t epochSamples = -1;
  /// Micro-batches drawn in total, each rank (TokenSampler::globalStep() under gradient
  /// accumulation: the key of the next random draw). A resume that changes the micro-batches per
  /// optimizer step continues from here, drawing no earlier micro-batch's windows again. -1: not
  /// recorded (a loop that draws by globalStep, or a checkpoint written before it existed).
  int64_t microSteps = -1;
};

struct CheckpointOptions {
  std::string dir = "checkpoints";
  int64_t keepLast = 3;  // older checkpoints are deleted (0: keep all)
  /// Recorded in the file. A resume from a file of another seed throws ConfigError naming both: the
  /// interrupted epoch's order would change, repeating some of its samples and skipping others.
  uint64_t seed = 0;
  /// What else the epochs' order depends on, by the names the user knows them ("train.shuffle" ->
  /// "true", "training samples" -> "60000"), recorded in the file and checked as `seed` is: a resume
  /// from a file where one of them differs throws ConfigError naming it and both values (names
  /// only one side has are not compared).
  std::map<std::string, std::string> sampleOrder;
  std::string config;    // recorded in the file: the run's settings, as text (e.g. YAML)
  /// The GPUs whose generators a one-process job saves and restores, in this order (DataParallel's
  /// replicas, as torch.cuda.get_rng_state_all() lists them). Empty: each rank's own GPU (the group's
  /// device), one state per rank. With several ranks, save() and resume throw ConfigError.
  std::vector<c10::Device> cudaGenerators;
  /// Called on every rank by resume()/resumeFrom() with the `config` text the file records ("" when
  /// its writer recorded none) and the file's path, after the seed and sampleOrder checks and before
  /// anything is loaded: throw (ConfigError) to refuse the file, nothing loaded and nothing logged as
  /// resumed. For settings no tensor's shape shows (a transformer's head count: the weights would
  /// load and compute another model). Every rank reads the same file, so all refuse alike.
  std::function<void(const std::string& recordedConfig, const std::string& path)> checkRecordedConfig;
};

/// The checkpoints a Checkpointer wrote into `dir` ("<dir>/ckpt-00000120.pt" for global step 120, or
/// the directory "<dir>/ckpt-00000120" of a fully sharded model's), oldest first; temporaries of
/// interrupted writes are not listed. Empty when `dir` holds none
/// or does not exist. The newest need not verify: Checkpointer::resume() skips damaged ones.
std::vector<std::string> listCheckpoints(const std::string& dir);

/// Training checkpoints for exact resume: model, optimizer state (SGD momentum and Adam/AdamW
/// moments by parameter name, as Python names them; any other LibTorch optimizer through its own
/// archive), the fp16 loss scaler's state (GradScaler.state_dict()), position, the CPU generator and
/// every rank's GPU generator; checksummed, written atomically by rank 0 (Python's torch.load reads
/// it).
///
/// The directory is this run's: rank 0 locks it for its process from the first save (or the first
/// resume from it), as the worker locks output.dir, so a second job saving or resuming there gets a
/// CheckpointError naming the holder's pid ("... is in use by another job (pid 4242 holds
/// <dir>/.ddp-launch.lock)"); the lock file is removed when the process exits normally.
/// `keepLast` counts and deletes only this run's checkpoints: those this process wrote into `dir`
/// (through any Checkpointer) and, after a resume from `dir`, the one it resumed from and the older
/// ones. Another run's checkpoints
/// there are left as they are (rank 0 warns once, naming them); a later resume() takes the newest
/// of all, theirs included, so give each run its own directory.
///
/// A model with fully sharded parameters (ddp::fullyShard) gets sharded checkpoints instead (as
/// torch.distributed.checkpoint's): the directory "<dir>/ckpt-00000120/", where each rank writes
/// "rank-0000r.pt" (its rows of every sharded parameter and of their optimizer state; rank 0 also
/// the rest) and rank 0 "manifest.json" last (full shapes, each rank's rows, each file's size), then
/// renames it into place; `dir` must be one directory every rank shares. Resume reshards: each rank
/// reads, from the files that hold them, the rows it holds now, at the same world size or another
/// (bitwise the saved values either way). A sharded checkpoint resumes an unsharded run (DDP,
/// ZeroRedundancyOptimizer) and a one-file checkpoint a sharded run. Sharded checkpoints hold
/// optimizer state by name: SGD, Adam, AdamW or FusedAdamW.
/// A sharded checkpoint (a directory) as one file with every tensor whole, as an unsharded run
/// writes it: for Python's torch.load, or to archive one file. Any run resumes from either. Reads
/// every rank's file; not collective. CheckpointError naming a missing or damaged file.
void consolidateCheckpoint(const std::string& shardedPath, const std::string& outPath);

class Checkpointer {
 public:
  Checkpointer(ProcessGroup group, CheckpointOptions options = {});
  /// Collective: every rank returns once the file is complete. Returns its path.
  /// With a scaler, its state is saved too. ConfigError on every rank when the ranks' steps differ,
  /// or the step is below one of this run's checkpoints in `dir` (written by this process, through
  /// any Checkpointer, or resumed from there): resume takes the highest step, so such a save would
  /// never be resumed from. A second save at the step of the last one returns its path without
  /// writing (a stop's save after a periodic one); at another position it is a ConfigError (a loop
  /// that does not count TrainPosition::globalStep would keep one checkpoint, its first).
  std::string save(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const TrainPosition& position,
                   const GradScaler* scaler = nullptr);
  /// Collective: loads the newest checkpoint of dir that verifies (skipping damaged ones) into the
  /// module, optimizer and generators; nullopt when there is none; CheckpointsDamagedError (a
  /// CheckpointError), nothing loaded, when every one there is damaged: a restart would meet them
  /// again, the user must move them out or repair one. Ranks that found different
  /// checkpoints get a CommError. Call after the module is on its device and the optimizer built.
  /// With a scaler, its saved state is restored (a file without one leaves it as it is, warning).
  /// The optimizer's per-parameter state (momentum, Adam's moments) is the file's; its options
  /// (lr, momentum, betas, weight decay) stay the ones it was built with, unlike Python's
  /// optimizer.load_state_dict, which restores its param_groups: build it with the run's values
  /// (a schedule sets the lr of each step anyway).
  std::optional<TrainPosition> resume(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                      GradScaler* scaler = nullptr);
  /// resume() from one file. Both throw ConfigError, before anything is loaded, when the file's
  /// seed or sampleOrder differs from the options'.
  TrainPosition resumeFrom(const std::string& path, torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                           GradScaler* scaler = nullptr);
  /// The CheckpointOptions::config text recorded in the checkpoint the last resume() or resumeFrom()
  /// loaded ("" before one, when none was found, or when its writer recorded none): to tell the
  /// user which of the run's settings the resumed run changes.
  const std::string& resumedConfig() const { return resumedConfig_; }

 private:
  // Rank 0 locks options_.dir (made first when `create`; a missing one is not locked); every rank
  // learns the outcome, so another job's lock fails them all alike. With a `step` (>= 0, a save):
  // also checks that every rank saves that step, on every call.
  void holdDirectory(ProcessGroup& group, bool create, int64_t step);
  // Rank 0: keepLast over this run's checkpoints, the others named once.
  void prune(const std::string& justWritten);

  ProcessGroup group_;
  CheckpointOptions options_;
  int64_t lastSavedStep_ = -1;
  std::optional<TrainPosition> lastSavedPosition_;  // of the last save (not of a resume)
  bool dirHeld_ = false;
  std::string resumedConfig_;
};

}  // namespace ddp
