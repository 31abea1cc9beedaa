// Sharded training checkpoints of fully sharded models (ddp::fullyShard): a directory
// "<dir>/ckpt-00000120/" with one file per rank ("rank-00001.pt": that rank's rows of every sharded
// parameter and of its optimizer state; rank 0's also everything replicated, the position, the
// generators and the config) and "manifest.json" (the full shape and each rank's rows of every
// sharded tensor, each file's size), written last: a directory without it is an interrupted write.
// Each file is a training checkpoint of its own (checksummed; Python's torch.load reads it).
// Loading reshards: each rank assembles, from the files that hold them, the rows its module needs,
// at any world size, or whole tensors for a module that is not sharded (a DDP run); a one-file
// checkpoint (a DDP run's) loads into a sharded module the same way.
#pragma once

#include <cstdint>
#include <string>

#include "ddp/process_group.h"
#include "libddp/checkpoint/checkpoint_dir.h"
#include "libddp/checkpoint/training_checkpoint.h"

namespace torch::nn {
class Module;
}

namespace ddp::checkpoint {

/// Whether a fullyShard unit holds any parameter of `module`: its checkpoints are then sharded.
bool holdsShardedParameters(const torch::nn::Module& module);

/// Writes shardedCheckpointPath(dir, state.globalStep): `state` is this rank's (its model and
/// optimizer entries as module.named_parameters() and the optimizer hold them: the shards); each
/// rank writes its rows of the sharded tensors, rank 0 also the rest, the manifest last, then the
/// directory is renamed into place. Collective; a failure on any rank throws CheckpointError on
/// every rank and leaves no checkpoint. `dir` must be one directory every rank sees (a shared
/// filesystem across hosts): rank 0 checks that every rank's file arrived. Returns the path.
std::string saveShardedCheckpoint(ProcessGroup& group, const TrainingState& state, const torch::nn::Module& module,
                                  const std::string& dir);

/// A training checkpoint (a sharded directory or one file) as `module` takes it: every entry of a
/// sharded parameter of `module` (its value and its optimizer state of the same shape) holds this
/// rank's rows of the full tensor, assembled from the files that hold them; every other entry is
/// whole (module == nullptr: all whole, one unsharded checkpoint). The rest (position, generators,
/// config) is rank 0's file's. Reads only the files it needs. CheckpointError naming the file for
/// a missing or damaged file or one that is not the file the manifest lists (another step's, another
/// rank's: its step, world size and checksum), for one rank's file given as the checkpoint, and
/// naming the key for a full shape that differs from the module's.
TrainingState loadTrainingStateFor(const std::string& path, const torch::nn::Module* module);

}  // namespace ddp::checkpoint
