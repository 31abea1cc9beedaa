#include "worker/train/generate_mode.h"

#include <ATen/ops/tensor.h>
#include <c10/core/GradMode.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/host_memory.h"
#include "ddp/files.h"
#include "ddp/state_dict.h"
#include "worker/data/datasets.h"
#include "worker/models/gpt.h"
#include "worker/models/model_size.h"
#include "worker/models/models.h"
#include "worker/train/metrics.h"
#include "worker/train/stop_signal.h"

namespace ddp::worker {
namespace {

// The bytes of UTF-8 character starting at text[i] (1 for a byte that starts none).
size_t utf8Length(const std::string& text, size_t i) {
  const auto c = static_cast<unsigned char>(text[i]);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
  return std::min(n, text.size() - i);
}

// generate.start, or the file a "FILE:path" start names (sample.py's convention).
std::string startText(const GenerateConfig& g) {
  if (g.start.rfind("FILE:", 0) != 0) return g.start;
  const std::string path = g.start.substr(5);
  // A folder reads as empty text, a named pipe blocks for a writer, a device (/dev/zero) never ends.
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    DDP_THROW(ConfigError, "config: 'generate.start' names '", path, "', which is not a file (a folder, a named pipe ",
              "or a device); give FILE:<path of a text file>, or the prompt itself");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) DDP_THROW(ConfigError, "config: 'generate.start' names the file '", path, "', which cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A prompt token the model has no embedding for (byte level with a model.vocab_size under 256, e.g.
// 128 for ASCII text) would index past its table.
void checkStartFitsModel(const std::vector<int64_t>& start, int64_t modelVocabulary) {
  for (size_t i = 0; i < start.size(); ++i) {
    if (start[i] < modelVocabulary) continue;
    DDP_THROW(ConfigError, "config: 'generate.start' holds token ", start[i], " (prompt token ", i,
              "), but the model's vocabulary has ", modelVocabulary, " tokens (model.vocab_size): its training data ",
              "had no such character; start with characters of that text");
  }
}

// A model trained on other data: its embedding has another number of tokens than the meta.json
// that would decode its samples (whose vocabulary sized the model here).
void checkModelVocabulary(const StateDict& weights, int64_t vocabulary, const std::string& metaPath,
                          const std::string& path) {
  const std::string wte = "transformer.wte.weight";
  for (const auto& [key, t] : weights) {
    const bool isWte = key == wte || (key.size() > wte.size() && key.compare(key.size() - wte.size() - 1,
                                                                             std::string::npos, "." + wte) == 0);
    if (!isWte || t.dim() != 2 || t.size(0) == vocabulary) continue;
    DDP_THROW(ConfigError, "generate: '", path, "' is a model of ", t.size(0), " tokens (", key, "), but '", metaPath,
              "' beside data.train_files has ", vocabulary, ": the model was trained on other data; point ",
              "data.train_files at that data (its meta.json decodes the samples), or set model.vocab_size=", t.size(0),
              " if it was trained with a padded vocabulary");
  }
}

}  // namespace

Vocabulary::Vocabulary(const std::string& metaPath) {
  if (std::filesystem::path(metaPath).extension() == ".pkl") {  // nanoGPT's char-level meta.pkl
    CharVocabulary meta = data::asBadTokenInput([&] { return readNanoGptMeta(metaPath); });
    level_ = "char";
    size_ = meta.vocabSize;
    itos_ = std::move(meta.itos);
    return;
  }
  std::ifstream in(metaPath);
  if (!in) {
    DDP_THROW(ConfigError, "mode generate decodes with the meta.json beside data.train_files, but '", metaPath,
              "' cannot be read; prepare the data with scripts/prepare_text.py");
  }
  nlohmann::json meta;
  try {
    in >> meta;
    level_ = meta.at("level").get<std::string>();
    size_ = meta.at("vocab_size").get<int64_t>();
    if (level_ == "char") itos_ = meta.at("itos").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    DDP_THROW(ConfigError, "'", metaPath, "' is not the meta.json scripts/prepare_text.py writes (", e.what(), ")");
  }
  if (level_ != "byte" && level_ != "char") {
    DDP_THROW(ConfigError, "'", metaPath, "' is a ", level_, "-level vocabulary; mode generate decodes byte and char "
              "levels (GPT-2's BPE: decode the exported model's samples in Python with tiktoken)");
  }
}

std::vector<int64_t> Vocabulary::encode(const std::string& text) const {
  std::vector<int64_t> tokens;
  if (level_ == "byte") {
    for (const char c : text) tokens.push_back(static_cast<unsigned char>(c));
    return tokens;
  }
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8Length(text, i);
    const std::string ch = text.substr(i, n);
    const auto it = std::find(itos_.begin(), itos_.end(), ch);
    if (it == itos_.end()) {
      DDP_THROW(ConfigError, "config: 'generate.start' holds '", ch, "' (byte ", i,
                "), which the data set's vocabulary lacks; start with characters of the training text");
    }
    tokens.push_back(it - itos_.begin());
    i += n;
  }
  return tokens;
}

std::string Vocabulary::decode(const std::vector<int64_t>& tokens, int64_t* outside) const {
  std::string text;
  int64_t left = 0;
  for (const int64_t t : tokens) {
    if (level_ == "byte" && t >= 0 && t < 256) text += static_cast<char>(t);
    else if (level_ == "char" && t >= 0 && t < static_cast<int64_t>(itos_.size())) text += itos_[static_cast<size_t>(t)];
    else ++left;
  }
  if (outside != nullptr) *outside = left;
  return text;
}

int runGenerateMode(const WorkerConfig& config, ProcessGroup& group) {
  const c10::Device device = group.device();
  DataConfig vocabularyOnly = config.data;  // sampling reads the vocabulary beside the training shards only
  vocabularyOnly.valFiles.clear();
  const Datasets data = loadDatasets(vocabularyOnly, config.seed);
  if (data.tokens->metaPath.empty()) {
    DDP_THROW(ConfigError, "mode generate decodes with the meta.json (or nanoGPT's meta.pkl) beside "
              "data.train_files, but there is none beside ", data.tokens->train->shards().front().path(),
              "; prepare the data with scripts/prepare_text.py (for GPT-2's tokens decode the exported model's "
              "samples in Python with tiktoken)");
  }
  const Vocabulary vocabulary(data.tokens->metaPath);
  InputSpec input = data.input;
  input.classes = config.model.vocabSize > 0 ? config.model.vocabSize : vocabulary.size();
  const std::vector<int64_t> start = vocabulary.encode(startText(config.generate));
  if (start.empty()) DDP_THROW(ConfigError, "config: 'generate.start' is empty; give at least one character");
  checkStartFitsModel(start, input.classes);
  checkInferenceFits(config.model, input, memoryLimit());
  auto model = makeModel(config.model, input);
  const std::string path = config.generate.modelPath.empty()
                               ? (std::filesystem::path(config.output.dir) / config.output.exportName).string()
                               : config.generate.modelPath;
  auto& gpt = dynamic_cast<GptImpl&>(*model.ptr());
  if (!std::filesystem::exists(path)) {
    DDP_THROW(ConfigError, "mode generate samples from a trained model, but '", path, "' does not exist",
              config.generate.modelPath.empty() ? " (output.dir/" + config.output.exportName + ")" : std::string(),
              "; train first (mode ddp or single with this output.dir), or set generate.model_path to the model "
              "(an export, a checkpoint, or nanoGPT's ckpt.pt)");
  }
  ModelFile file = readModelFile(path);
  if (config.model.vocabSize == 0) checkModelVocabulary(file.state, input.classes, data.tokens->metaPath, path);
  loadGptModelFile(gpt, std::move(file), path);
  model.ptr()->to(device);
  model.ptr()->eval();
  torch::manual_seed(config.seed);
  const at::Tensor idx = at::tensor(start, at::TensorOptions().dtype(at::kLong)).unsqueeze(0).to(device);
  const auto topK = config.generate.topK > 0 ? std::optional<int64_t>(config.generate.topK) : std::nullopt;
  nlohmann::json samples = nlohmann::json::array();
  // Ctrl-C or SIGTERM ends the sampling after the sample being made, and generated.json keeps the
  // samples made so far (a second Ctrl-C ends the process at once).
  installStopSignalHandlers();
  for (int64_t s = 0; s < config.generate.numSamples && stopSignal() == 0; ++s) {
    const at::Tensor out = gpt.generate(idx, config.generate.maxNewTokens, config.generate.temperature, topK).cpu();
    const std::vector<int64_t> tokens(out.data_ptr<int64_t>(), out.data_ptr<int64_t>() + out.numel());
    int64_t outside = 0;
    const std::string text = vocabulary.decode(tokens, &outside);
    if (outside > 0) {
      spdlog::warn("sample {}: {} of its tokens lie past the data's vocabulary of {} (model.vocab_size {}) and have no "
                   "text; they are left out", s + 1, outside, vocabulary.size(), input.classes);
    }
    std::printf("%s\n---------------\n", text.c_str());  // sample.py's separator
    std::fflush(stdout);  // each sample as it is made, into a pipe or a file too
    samples.push_back(text);
  }
  makeDirectories(config.output.dir, "output.dir");
  nlohmann::json record = {{"mode", "generate"}, {"model_path", std::filesystem::absolute(path).string()},
                           {"device", device.str()}, {"seed", config.seed}, {"temperature", config.generate.temperature},
                           {"top_k", config.generate.topK}, {"max_new_tokens", config.generate.maxNewTokens},
                           {"samples", samples}};
  // A signal during the last sample stopped nothing: the run is complete.
  const int signal = static_cast<int64_t>(samples.size()) < config.generate.numSamples ? stopSignal() : 0;
  if (signal != 0) record["stopped_by_signal"] = signal;
  writeSummary(config.output.dir + "/generated.json", record);
  if (signal != 0) {
    spdlog::warn("stopped on signal {} after {} of {} samples (generate.num_samples); they are kept in "
                 "{}/generated.json", signal, samples.size(), config.generate.numSamples, config.output.dir);
    return 128 + signal;  // as the training modes: a process stopped by the signal, its work kept
  }
  spdlog::info("generated {} samples of {} tokens with {} (kept in {}/generated.json)", config.generate.numSamples,
               config.generate.maxNewTokens, path, config.output.dir);
  return 0;
}

}  // namespace ddp::worker
