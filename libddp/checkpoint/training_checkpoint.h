// Full training state for exact resume: model, optimizer momentum, progress,
// RNG states and the resolved config, with a checksum over all of it. The file
// is a plain dict that Python's torch.load also reads.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddp::checkpoint {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

/// An fp16 loss scaler's state, as Python's GradScaler.state_dict() names it.
struct ScalerState {
  double scale = 65536.0;
  double growthFactor = 2.0;
  double backoffFactor = 0.5;
  int64_t growthInterval = 2000;
  int64_t growthTracker = 0;
};

struct TrainingState {
  NamedTensors model;        // plain keys, CPU
  NamedTensors optimizer;    // "momentum_buffer.<param name>", "exp_avg.<param name>", ..., CPU
  std::optional<ScalerState> scaler;  // "scaler": GradScaler.state_dict() (fp16 runs only)
  int64_t epoch = 0;         // epoch in progress
  int64_t stepInEpoch = 0;   // optimizer steps already taken in that epoch
  int64_t globalStep = 0;    // optimizer steps since the start of training
  int64_t samples = 0;       // training samples consumed, all ranks
  int64_t worldSize = 1;     // the sampler's shards depend on it
  std::optional<int64_t> epochSamples;  // positions of the epoch's permutation consumed, all ranks
                                        // (absent in files written before it existed)
  std::optional<int64_t> microSteps;    // micro-batches drawn, each rank (absent when not recorded)
  int64_t seed = 0;
  std::map<std::string, std::string> sampleOrder;  // "progress"/"sample_order" (absent before it existed)
  at::Tensor cpuRng;                // the default CPU generator's state (rank 0's)
  std::vector<at::Tensor> cpuRngRanks;  // ranks 1, 2, ...'s CPU generators ("cpu1", ...; absent in
                                        // files written before them and of one-rank jobs)
  std::vector<at::Tensor> cudaRng;  // rank r's own GPU generator at [r] (empty on CPU)
  std::string config;               // resolved YAML of the run that wrote it
};

constexpr const char* kCheckpointFormat = "ddp-launch-checkpoint/1";

/// CRC-32 over every tensor's name, dtype, shape and bytes and every field.
uint32_t checksumOf(const TrainingState& state);

/// Serialises with its checksum and writes atomically (temporary file, fsync,
/// rename, fsync of the directory): a crash leaves the old file or the new one.
void saveTrainingCheckpoint(const TrainingState& state, const std::string& path);

/// Reads and verifies; throws CheckpointError naming the file when it is
/// truncated, corrupt (checksum) or not a training checkpoint.
TrainingState loadTrainingCheckpoint(const std::string& path);

}  // namespace ddp::checkpoint
