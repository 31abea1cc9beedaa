// The size of the configured model, known before any tensor is allocated, so a model that
// cannot fit fails with one line instead of an allocator error deep inside LibTorch.
#pragma once

#include <cstdint>
#include <string>

#include "worker/config/config.h"
#include "worker/models/models.h"

namespace ddp::worker {

/// Parameters makeModel(config, input) will create (as a double: absurd widths overflow int64).
double parameterCount(const ModelConfig& config, const InputSpec& input);

/// Bytes one training rank holds per parameter: weights, gradients, SGD momentum and the
/// reducer's bucket copy, fp32 each.
constexpr double kTrainingBytesPerParameter = 4.0 * 4;

/// The config keys that make `config`'s model smaller, for the lines that say it does not fit:
/// "smaller model.n_layer / model.n_embd" (gpt), "smaller model.hidden widths" (mlp), else
/// "a smaller model.name".
std::string smallerModelKeys(const ModelConfig& config);

/// Bytes a process that only runs the model (mode eval, generate) holds per parameter: the
/// weights and the file's copy read to load them, fp32 each.
constexpr double kInferenceBytesPerParameter = 4.0 * 2;

/// What the model is built for: training (kTrainingBytesPerParameter) or running a trained one.
enum class ModelUse { kTraining, kInference };

/// Throws ConfigError when `ranksOnHost` processes of this model need more than `memoryBytes`
/// (this host's RAM): one line with the parameter count and the sizes.
void checkModelFits(const ModelConfig& config, const InputSpec& input, int ranksOnHost, double memoryBytes,
                    ModelUse use = ModelUse::kTraining);

}  // namespace ddp::worker
