// Start-up: path checks, so a bad path fails in the first second with the key to fix, not after
// the training (an export name too long) or with a misleading reading error; LibTorch's numerics.
#pragma once

#include "worker/config/config.h"

namespace ddp::worker {

/// `resume` (a path, not auto) and `eval.model_path` must not be directories. Throws
/// ConfigError naming the key. A missing file is left to the loaders' own messages.
void checkInputPaths(const WorkerConfig& config);

/// Rank 0's outputs: creates output.dir (and checkpoint.dir when checkpoints are scheduled)
/// and proves a file named like each output can be created there, removing the probes.
/// Throws ConfigError naming the key to change.
void checkOutputPaths(const WorkerConfig& config);

/// For a run that fails: removes the directories checkOutputPaths made (output.dir, checkpoint.dir,
/// and the parents it had to create) where they hold nothing but empty directories once this
/// process's lock files are removed, so that a refused run leaves nothing behind. Releases the
/// directory locks: only as the process ends.
void removeUnusedOutputDirs();

/// cudnn.benchmark, cudnn.deterministic and deterministic_algorithms, as torch.backends.cudnn and
/// torch.use_deterministic_algorithms set them for the process. With deterministic algorithms it
/// also sets CUBLAS_WORKSPACE_CONFIG=:4096:8 when unset (cuBLAS needs it to be deterministic;
/// PyTorch only tells users to set it). Before any CUDA work.
void applyNumerics(const WorkerConfig& config);

}  // namespace ddp::worker
