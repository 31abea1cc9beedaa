// The size of the configured model and of what training it keeps, known before any tensor is
// allocated, so a job that cannot fit fails with one line instead of an allocator error deep
// inside LibTorch or the kernel's OOM kill.
#pragma once

#include <cstdint>
#include <string>

#include "common/host_memory.h"
#include "worker/config/config.h"
#include "worker/models/models.h"

namespace ddp::worker {

/// Parameters makeModel(config, input) will create (as a double: absurd widths overflow int64); 0 for
/// a torchscript model, whose file alone knows.
double parameterCount(const ModelConfig& config, const InputSpec& input);

/// The config keys that make `config`'s model smaller, for the lines that say it does not fit:
/// "smaller model.n_layer / model.n_embd" (gpt), "smaller model.hidden widths" (mlp), else
/// "a smaller model.name".
std::string smallerModelKeys(const ModelConfig& config);

/// Bytes a process that only runs the model (mode eval, generate) holds per parameter: the
/// weights and the file's copy read to load them, fp32 each.
constexpr double kInferenceBytesPerParameter = 4.0 * 2;

/// What one training rank holds, in bytes: a lower bound, so that a job refused for it could
/// never have run.
struct TrainingMemory {
  /// On the CPU: fp32 weights, gradients, the optimizer's state (SGD momentum: one value a
  /// parameter, Adam(W): two) and the bucketed reducer's copy (world > 1, unless
  /// comm.gradient_as_bucket_view), each divided by the world where train.sharding zero2/full
  /// shards it (zero1's uneven greedy split: its state not counted); full sharding never below the
  /// whole weights, which every rank builds before sharding them. On a GPU: the weights the host
  /// builds before they move (the rest is the GPU's memory).
  double state = 0;
  /// One micro-batch's activations that autograd keeps for the backward: a GPT on the CPU only
  /// (16 values a token, channel and layer (LibTorch 1.x: and n_head · block_size for the T × T
  /// softmax), 2 a token and vocabulary entry for the logits; with
  /// train.activation_checkpointing one value a layer and one block's 16); 0 where not counted
  /// (other models; on a GPU they take the GPU's memory, not the host's).
  double activations = 0;
};

/// trainingMemory for `worldSize` ranks on `onCpu` (the ranks' device is the CPU). Mode dp is one
/// process (worldSize 1): its replicas share the weights and split the batch (their gradient
/// copies not counted).
TrainingMemory trainingMemory(const WorkerConfig& config, const InputSpec& input, int worldSize, bool onCpu);

/// Throws ConfigError when `ranksOnHost` training ranks need more than `memory` (this process's
/// limit: the host's RAM or its cgroup's): one line with the parameter count, the sizes and the
/// keys that shrink what dominates.
void checkTrainingFits(const WorkerConfig& config, const InputSpec& input, int ranksOnHost, int worldSize, bool onCpu,
                       const MemoryLimit& memory);

/// The same for a process that only runs the model (mode eval, generate).
void checkInferenceFits(const ModelConfig& config, const InputSpec& input, const MemoryLimit& memory);

}  // namespace ddp::worker
