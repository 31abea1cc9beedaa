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

// What a shard directory's vocabulary file says its token ids mean: level, size and the tokens'
// texts (not the token counts, which differ between data sets of one vocabulary); "" without one.
std::string vocabularyOf(const std::filesystem::path& dir) {
  if (std::filesystem::is_regular_file(dir / "meta.json")) {
    std::ifstream in(dir / "meta.json");
    const nlohmann::json meta = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (meta.is_discarded() || !meta.is_object()) return "";
    return nlohmann::json{{"level", meta.value("level", nlohmann::json())}, {"vocab_size", meta.value("vocab_size", nlohmann::json())},
                          {"itos", meta.value("itos", nlohmann::json())}}.dump();
  }
  if (std::filesystem::exists(dir / "meta.pkl")) {
    const CharVocabulary v = asBadTokenInput([&] { return readNanoGptMeta((dir / "meta.pkl").string()); });
    return nlohmann::json{{"vocab_size", v.vocabSize}, {"itos", v.itos}}.dump();
  }
  return "";
}

int64_t vocabularySize(const std::string& described) {
  const nlohmann::json size = nlohmann::json::parse(described).value("vocab_size", nlohmann::json(0));
  return size.is_number_integer() ? size.get<int64_t>() : 0;
}

// Shards of different vocabularies (a glob over two prepared data sets): token ids would mean
// different characters in each. The directories with a vocabulary file must agree.
void checkOneVocabulary(const TokenCorpus& corpus) {
  std::string firstDir, first;
  for (const auto* data : {corpus.train.get(), corpus.val.get()}) {
    if (data == nullptr) continue;
    for (const auto& shard : data->shards()) {
      const auto dir = std::filesystem::path(shard.path()).parent_path();
      const std::string described = vocabularyOf(dir);
      if (described.empty()) continue;
      if (first.empty()) {
        first = described;
        firstDir = dir.string();
      } else if (described != first) {
        DDP_THROW(ConfigError, "data: the shards come from data sets of different vocabularies: ", firstDir,
                  "/ (vocab_size ", vocabularySize(first), ") and ", dir.string(), "/ (vocab_size ",
                  vocabularySize(described), "), so one token id would mean different text in each; give "
                  "data.train_files and data.val_files globs of one prepared data set");
      }
    }
  }
}

}  // namespace

std::vector<std::string> shardsInBoth(const TokenCorpus& corpus) {
  std::vector<std::string> both;
  if (!corpus.val) return both;
  for (const auto& v : corpus.val->shards()) {
    for (const auto& t : corpus.train->shards()) {
      std::error_code ec;
      if (std::filesystem::equivalent(v.path(), t.path(), ec)) both.push_back(v.path());
    }
  }
  return both;
}

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
  checkOneVocabulary(corpus);
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
