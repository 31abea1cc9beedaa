#include "worker/models/model_size.h"

#include <unistd.h>

#include <cstdio>
#include <sstream>

#include "common/error.h"
#include "worker/models/resnet.h"

namespace ddp::worker {
namespace {

double linear(double in, double out) { return in * out + out; }

// "23.5 GiB", "8.88 PiB": three digits in the largest unit that keeps the number >= 1.
std::string gib(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  size_t unit = 0;
  while (bytes >= 1024 && unit + 1 < sizeof units / sizeof units[0]) {
    bytes /= 1024;
    ++unit;
  }
  char text[64];
  std::snprintf(text, sizeof text, "%.3g %s", bytes, units[unit]);
  return text;
}

std::string widths(const std::vector<int64_t>& hidden) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < hidden.size(); ++i) out << (i == 0 ? "" : ", ") << hidden[i];
  out << ']';
  return out.str();
}

}  // namespace

double parameterCount(const ModelConfig& config, const InputSpec& input) {
  double count = 0;
  if (config.name == "mlp") {
    double width = static_cast<double>(input.channels * input.height * input.width);
    for (const int64_t h : config.hidden) {
      count += linear(width, static_cast<double>(h));
      width = static_cast<double>(h);
    }
    count += linear(width, static_cast<double>(input.classes));
  } else if (isResNet(config.name)) {
    count += resNetParameterCount(config.name, input.channels, input.classes);
  } else if (config.name == "gpt") {  // worker/models/gpt.h; input.classes: the vocabulary
    const double c = static_cast<double>(config.nEmbd);
    const double biasTerms = config.bias ? 13 * c : 2 * c;  // a block's biases and LayerNorm weights
    count += static_cast<double>(config.vocabSize > 0 ? config.vocabSize : input.classes) * c;  // wte = lm_head
    count += static_cast<double>(config.blockSize) * c;                                          // wpe
    count += static_cast<double>(config.nLayer) * (12 * c * c + biasTerms) + (config.bias ? 2 * c : c);
  } else {  // cnn, as in models.cc
    count += static_cast<double>(input.channels) * 32 * 9 + 32;
    count += 32.0 * 64 * 9 + 64;
    if (config.batchNorm) count += 2 * 32 + 2 * 64;
    count += linear(64.0 * static_cast<double>(input.height / 4) * static_cast<double>(input.width / 4), 128);
    count += linear(128, static_cast<double>(input.classes));
  }
  if (config.unusedLayer) count += linear(4, 2);
  return count;
}

std::string smallerModelKeys(const ModelConfig& config) {
  if (config.name == "gpt") return "smaller model.n_layer / model.n_embd";
  if (config.name == "mlp") return "smaller model.hidden widths";
  return "a smaller model.name";
}

void checkModelFits(const ModelConfig& config, const InputSpec& input, int ranksOnHost, double memoryBytes,
                    ModelUse use) {
  const bool training = use == ModelUse::kTraining;
  const double parameters = parameterCount(config, input);
  const double perRank = parameters * (training ? kTrainingBytesPerParameter : kInferenceBytesPerParameter);
  const double needed = perRank * ranksOnHost;
  if (memoryBytes <= 0 || needed <= memoryBytes) return;
  char count[32];
  std::snprintf(count, sizeof count, "%.3g", parameters);
  DDP_THROW(ConfigError, "config: model '", config.name, "'",
            config.name == "mlp" ? " with model.hidden=" + widths(config.hidden) : std::string(), " has ", count,
            " parameters: ", training ? "training" : "running it", " needs about ", gib(perRank),
            training ? " per rank (weights, gradients, momentum, buckets)" : " (its weights and the file's copy)",
            ranksOnHost > 1 ? ", " + gib(needed) + " for the " + std::to_string(ranksOnHost) + " ranks on this host" : "",
            ", but this host has ", gib(memoryBytes),
            "; use ", smallerModelKeys(config));
}

}  // namespace ddp::worker
