// mode: generate — text from a trained gpt, as nanoGPT's sample.py: the start text encoded with the
// data set's vocabulary (meta.json beside data.train_files: bytes, or the characters of a char-level
// set), generate.num_samples samples of generate.max_new_tokens tokens at generate.temperature with
// generate.top_k, decoded and printed; summary.json holds them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/process_group.h"
#include "worker/config/config.h"

namespace ddp::worker {

/// A data set's vocabulary as scripts/prepare_text.py's meta.json gives it.
class Vocabulary {
 public:
  /// Reads `metaPath` (ConfigError: not there, not JSON, a level it cannot decode).
  explicit Vocabulary(const std::string& metaPath);
  /// `text` as tokens; ConfigError naming a character the vocabulary lacks.
  std::vector<int64_t> encode(const std::string& text) const;
  /// Tokens as text (byte level: the bytes; char level: the characters). A token outside the
  /// vocabulary (a model.vocab_size padded past the data's, as nanoGPT pads GPT-2's 50257 to 50304)
  /// has no text: it is left out and counted in `*outside`.
  std::string decode(const std::vector<int64_t>& tokens, int64_t* outside = nullptr) const;
  int64_t size() const { return size_; }

 private:
  std::string level_;
  int64_t size_ = 0;
  std::vector<std::string> itos_;  // char level
};

/// Runs mode generate on `group`'s device (one process). Returns the exit code.
int runGenerateMode(const WorkerConfig& config, ProcessGroup& group);

}  // namespace ddp::worker
