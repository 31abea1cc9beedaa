#include "worker/models/model_size.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include <torch/version.h>

#include "common/error.h"
#include "worker/models/resnet.h"

namespace ddp::worker {
namespace {

double linear(double in, double out) { return in * out + out; }

std::string widths(const std::vector<int64_t>& hidden) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < hidden.size(); ++i) out << (i == 0 ? "" : ", ") << hidden[i];
  out << ']';
  return out.str();
}

std::string count(double parameters) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", parameters);
  return text;
}

}  // namespace

double parameterCount(const ModelConfig& config, const InputSpec& input) {
  if (config.name == "torchscript") return 0;  // its file says, once loaded: not counted
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

TrainingMemory trainingMemory(const WorkerConfig& config, const InputSpec& input, int worldSize, bool onCpu) {
  const TrainConfig& t = config.train;
  TrainingMemory memory;
  const double parameters = parameterCount(config.model, input);
  if (!onCpu) {  // on a GPU the host holds the weights it builds before they move to the device
    memory.state = 4 * parameters;
    return memory;
  }
  const double world = std::max(1, worldSize);
  const double optimizerValues = t.optimizer == "sgd" ? (t.momentum > 0 ? 1 : 0) : 2;
  // The bucketed reducer's copy lives through backward; the flat reducer's buffer only after it,
  // when the activations are gone: not counted.
  const bool bucket = worldSize > 1 && !config.comm.ddp.gradientAsBucketView &&
                      config.comm.ddp.reducer == GradientReducer::kBucketed &&
                      (t.sharding == Sharding::kNone || t.sharding == Sharding::kZero1);
  double weights = 1, gradients = 1, optimizer = optimizerValues;
  // ZeRO-1 hands out whole tensors greedily: a rank may hold far less than 1/world of the state.
  if (t.sharding == Sharding::kZero1 && worldSize > 1) optimizer = 0;
  if (t.sharding == Sharding::kZero2) gradients /= world, optimizer /= world;
  if (t.sharding == Sharding::kFull) weights /= world, gradients /= world, optimizer /= world;
  const double perParameter = 4 * std::max(1.0, weights + gradients + optimizer + (bucket ? 1 : 0));
  memory.state = perParameter * parameters;
  if (config.model.name == "gpt") {
    const ModelConfig& m = config.model;
    const double c = static_cast<double>(m.nEmbd), layers = static_cast<double>(m.nLayer);
    const double vocab = static_cast<double>(m.vocabSize > 0 ? m.vocabSize : input.classes);
    // A block keeps its input, both LayerNorms' outputs, q/k/v, the attention's output, the residual,
    // the MLP's 4C before and after GELU: 16 values a token and channel. bf16/fp16: at least 2 bytes.
#if TORCH_VERSION_MAJOR >= 2
    const double attention = 0;  // scaled_dot_product_attention keeps no T × T scores
#else
    // LibTorch 1.x has no scaled_dot_product_attention: worker/models/gpt.cc's math attention keeps
    // each head's T × T softmax, n_head · block_size values a token.
    const double attention = static_cast<double>(m.nHead * m.blockSize);
#endif
    const double blocks = t.activationCheckpointing ? (layers + 16) * c + attention : layers * (16 * c + attention);
    const double bytes = t.precision == "fp32" ? 4 : 2;
    memory.activations = static_cast<double>(t.batchSize) * static_cast<double>(m.blockSize) * bytes *
                         (blocks + 2 * c + 2 * vocab);
  }
  return memory;
}

void checkTrainingFits(const WorkerConfig& config, const InputSpec& input, int ranksOnHost, int worldSize, bool onCpu,
                       const MemoryLimit& memory) {
  const TrainingMemory need = trainingMemory(config, input, worldSize, onCpu);
  const double perRank = need.state + need.activations;
  const double needed = perRank * ranksOnHost;
  if (memory.bytes <= 0 || needed <= memory.bytes) return;
  const ModelConfig& m = config.model;
  std::string parts = onCpu ? "weights, gradients, optimizer state" : "the weights it builds before they move to the GPU";
  std::string fix = smallerModelKeys(m);
  if (need.activations > 0) {
    std::ostringstream text;
    text << ' ' << formatBytes(need.state) << "; the activations of " << config.train.batchSize << " windows of "
         << m.blockSize << " tokens " << formatBytes(need.activations);
    parts += text.str();
  }
  if (need.activations > need.state) {
    fix = "a smaller train.batch_size (train.accumulate_steps keeps the batch)";
    if (!config.train.activationCheckpointing) fix += ", train.activation_checkpointing: true";
    fix += ", or smaller model.n_layer / model.n_embd / model.block_size";
  } else if (onCpu && config.train.sharding != Sharding::kFull && worldSize > 1) {
    fix += ", or train.sharding: full";
  }
  DDP_THROW(ConfigError, "config: model '", m.name, "'",
            m.name == "mlp" ? " with model.hidden=" + widths(m.hidden) : std::string(), " has ",
            count(parameterCount(m, input)), " parameters: training needs about ", formatBytes(perRank),
            " per rank (", parts, ")",
            ranksOnHost > 1 ? ", " + formatBytes(needed) + " for the " + std::to_string(ranksOnHost) + " ranks on this host"
                            : "",
            ", but ", describeMemory(memory), "; use ", fix);
}

void checkInferenceFits(const ModelConfig& config, const InputSpec& input, const MemoryLimit& memory) {
  const double parameters = parameterCount(config, input);
  const double needed = parameters * kInferenceBytesPerParameter;
  if (memory.bytes <= 0 || needed <= memory.bytes) return;
  DDP_THROW(ConfigError, "config: model '", config.name, "'",
            config.name == "mlp" ? " with model.hidden=" + widths(config.hidden) : std::string(), " has ",
            count(parameters), " parameters: running it needs about ", formatBytes(needed),
            " (its weights and the file's copy), but ", describeMemory(memory), "; use ", smallerModelKeys(config));
}

}  // namespace ddp::worker
