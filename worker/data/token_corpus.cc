#include "worker/data/token_corpus.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "common/error.h"

namespace ddp::worker::data {
namespace {

int64_t metaVocabulary(const std::string& path) {
  std::ifstream in(path);
  nlohmann::json meta;
  try {
    in >> meta;
  } catch (const nlohmann::json::exception& e) {
    DDP_THROW(ConfigError, "data: '", path, "' is not JSON (", e.what(), "); write it with scripts/prepare_text.py");
  }
  if (!meta.contains("vocab_size") || !meta["vocab_size"].is_number_integer() || meta["vocab_size"].get<int64_t>() < 1) {
    DDP_THROW(ConfigError, "data: '", path, "' has no positive integer vocab_size; set model.vocab_size");
  }
  return meta["vocab_size"].get<int64_t>();
}

}  // namespace

TokenCorpus loadTokenCorpus(const DataConfig& config) {
  TokenCorpus corpus;
  corpus.train = asBadTokenInput([&] { return std::make_shared<const TokenData>(config.trainFiles, "data.train_files"); });
  if (!config.valFiles.empty()) {
    corpus.val = asBadTokenInput([&] { return std::make_shared<const TokenData>(config.valFiles, "data.val_files"); });
  }
  const auto dir = std::filesystem::path(corpus.train->shards().front().path()).parent_path();
  if (std::filesystem::is_regular_file(dir / "meta.json")) {
    corpus.metaPath = (dir / "meta.json").string();
    corpus.vocabSize = metaVocabulary(corpus.metaPath);
  } else if (std::filesystem::exists(dir / "meta.pkl")) {  // nanoGPT's data/<name>/ as its prepare.py leaves it
    corpus.metaPath = (dir / "meta.pkl").string();
    corpus.vocabSize = asBadTokenInput([&] { return readNanoGptMeta(corpus.metaPath).vocabSize; });
  }
  return corpus;
}

int64_t checkedVocabulary(const TokenCorpus& corpus, const ModelConfig& model) {
  const int64_t vocab = model.vocabSize > 0 ? model.vocabSize : corpus.vocabSize;
  if (vocab <= 0) {
    const std::string first = corpus.train->shards().front().path();
    DDP_THROW(ConfigError, "config: model.vocab_size is 0 (the data set's) but no meta.json (or nanoGPT's meta.pkl) "
              "lies beside ", first, "; set model.vocab_size to the tokenizer's (50304 for GPT-2's tokens as nanoGPT "
              "pads them; a char-level set's number of characters)");
  }
  for (const auto* data : {corpus.train.get(), corpus.val.get()}) {
    if (data == nullptr) continue;
    asBadTokenInput([&] {
      data->checkVocabulary(vocab, "model.vocab_size");
      data->checkBlockSize(model.blockSize, "model.block_size");
      return 0;
    });
  }
  return vocab;
}

}  // namespace ddp::worker::data
