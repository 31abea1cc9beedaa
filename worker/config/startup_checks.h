// Start-up: path checks, so a bad path fails in the first second with the key to fix, not after
// the training (an export name too long) or with a misleading reading error; LibTorch's numerics.
#pragma once

#include "worker/config/config.h"

namespace ddp::worker {

/// The files the run reads at start: `resume` (a path), `init.model_path` (rank 0, unless a
/// resume replaces it), `eval.model_path`, `generate.model_path` must exist and be readable, and
/// be files (or a sharded checkpoint's directory). Throws ConfigError naming the key.
void checkInputPaths(const WorkerConfig& config);

/// Whether config.resume will replace the initial weights: it names a checkpoint, or resume=auto
/// finds one in checkpoint.dir (all damaged: the resume ends the run instead). Then init.model_path
/// is not read (a fine-tuning job restarted after its first checkpoint skips the pretrained file).
bool resumeReplacesInitialWeights(const WorkerConfig& config);

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
