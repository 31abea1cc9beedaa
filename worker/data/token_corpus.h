// data.name: tokens — a language model's corpus: token shards memory-mapped through the library
// (<ddp/token_data.h>; the page cache is the host's one copy) and the vocabulary the preparation
// wrote beside them (scripts/prepare_text.py's meta.json).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "ddp/token_data.h"
#include "worker/config/config.h"

namespace ddp::worker::data {

struct TokenCorpus {
  std::shared_ptr<const TokenData> train;
  std::shared_ptr<const TokenData> val;  // null without data.val_files
  int64_t vocabSize = 0;                 // meta.json's (or meta.pkl's) vocab_size, 0 when there is none
  std::string metaPath;                  // meta.json, else nanoGPT's meta.pkl, beside the first training shard; "" when neither
};

/// Runs `f`: a DataError of the token library (a malformed shard, too few tokens for a step) is the
/// user's input, so it becomes a ConfigError (exit 2) with the same line, `hint` appended.
template <typename F>
auto asBadTokenInput(F&& f, const std::string& hint = "") {
  try {
    return f();
  } catch (const ddp::DataError& e) {
    DDP_THROW(ConfigError, e.what(), hint);
  }
}

/// Maps data.train_files (and data.val_files) and reads meta.json (else nanoGPT's meta.pkl) from
/// the first training shard's directory. A shard the library refuses (wrong magic or version, truncated, a count the size
/// disagrees with) or a glob with no match is bad input: ConfigError, the library's line; so are
/// shards from directories whose vocabulary files (meta.json / meta.pkl) differ (one token id
/// would mean different text in each).
TokenCorpus loadTokenCorpus(const DataConfig& config);

/// The shards data.val_files and data.train_files both match (a train glob that takes the
/// validation shards too: the validation loss would be measured on training data).
std::vector<std::string> shardsInBoth(const TokenCorpus& corpus);

/// The vocabulary a gpt trains with: model.vocab_size, else meta.json's; checks that the shards
/// hold no token >= it and fit model.block_size + 1 (ConfigError naming the file and position).
int64_t checkedVocabulary(const TokenCorpus& corpus, const ModelConfig& model);

}  // namespace ddp::worker::data
