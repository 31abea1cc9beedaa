// Token data for language models: shards of token ids in llm.c's format or nanoGPT's raw uint16
// .bin, memory-mapped read-only (a 10 GB corpus costs page cache shared by the ranks of a host, not
// 10 GB per rank), and the windows of block size + 1 tokens a training step reads from them, drawn
// as nanoGPT's get_batch draws them (random) or as llm.c's DataLoader walks them (sequential).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/enum_names.h"

namespace ddp {

/// How a shard stores its tokens.
enum class TokenFormat {
  kLlmcUint16,  // llm.c: 256 × int32 header (magic 20240520, version 1, token count), uint16 tokens
  kLlmcUint32,  // llm.c: 256 × int32 header (magic 20240801, version 7, token count), uint32 tokens
  kRawUint16,   // nanoGPT's train.bin / val.bin: uint16 tokens, no header
};

/// "llmc-uint16", "llmc-uint32", "raw-uint16".
inline const char* tokenFormatName(TokenFormat format) {
  switch (format) {
    case TokenFormat::kLlmcUint16: return "llmc-uint16";
    case TokenFormat::kLlmcUint32: return "llmc-uint32";
    case TokenFormat::kRawUint16: return "raw-uint16";
  }
  return "?";
}

/// How TokenSampler draws the windows of a step.
enum class TokenSampling {
  kRandom,      // nanoGPT's get_batch: uniform random starts, from (seed, rank, step)
  kSequential,  // llm.c's DataLoader: consecutive windows, rank-strided, each once per epoch
};

/// "random", "sequential".
inline const char* tokenSamplingName(TokenSampling sampling) {
  switch (sampling) {
    case TokenSampling::kRandom: return "random";
    case TokenSampling::kSequential: return "sequential";
  }
  return "?";
}
/// The sampling a name (random | sequential) chooses; nullopt for any other.
inline std::optional<TokenSampling> parseTokenSampling(std::string_view name) {
  return detail::fromName(name, {TokenSampling::kRandom, TokenSampling::kSequential}, tokenSamplingName);
}

/// One shard file, memory-mapped read-only (PROT_READ, MAP_SHARED: the page cache is the only
/// copy); nothing is read until a token is asked for. Format by content: llm.c's magic in the first
/// int32 makes it an llm.c shard, anything else is raw uint16. The const methods may be called
/// from several threads at once. Move-only.
class TokenShard {
 public:
  /// Maps `path`. Throws DataError, one line naming the file, for a file that cannot be opened or
  /// is not a regular file, an empty file, an llm.c magic with another version, an llm.c header cut
  /// short, a token count that disagrees with the file's size (both numbers), an llm.c header (its
  /// version and a count that fits the size) under another magic, a raw file of an odd number of
  /// bytes.
  explicit TokenShard(const std::string& path);
  ~TokenShard();
  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  /// Tokens in the shard (llm.c: the header's count).
  int64_t size() const { return size_; }
  TokenFormat format() const { return format_; }
  /// 2 (uint16) or 4 (uint32).
  int bytesPerToken() const { return bytesPerToken_; }

  /// Token `i` (0-based, after any header).
  int64_t at(int64_t i) const;
  /// Copies tokens [start, start + n) into `out` as int64 (ConfigError when out of range).
  void read(int64_t start, int64_t n, int64_t* out) const;
  /// Tokens [start, start + n) as a new int64 CPU tensor [n].
  at::Tensor tokens(int64_t start, int64_t n) const;
  /// The first position holding a token >= `bound`, or -1 when there is none (a scan of the
  /// whole file, at memory speed; skipped, -1, when no token of the format can reach `bound`).
  int64_t firstTokenAtLeast(int64_t bound) const;
  /// DataError naming the file, the first position with a token >= vocabSize and that token;
  /// `setting` is how the message names the vocabulary size (e.g. "model.vocab_size").
  void checkVocabulary(int64_t vocabSize, const std::string& setting = "the vocabulary size") const;
  /// DataError naming the file when it holds fewer than blockSize + 1 tokens (no window fits).
  void checkBlockSize(int64_t blockSize, const std::string& setting = "the block size") const;
  /// Tells the kernel how the pages will be read (madvise): random → MADV_RANDOM (no read-ahead
  /// for windows scattered over the file), sequential → MADV_SEQUENTIAL.
  void advise(TokenSampling sampling) const;
  /// DataError naming the file when a program has changed it in place since it was mapped (its size
  /// or modification time differ: nanoGPT's prepare.py and np.memmap rewrite shards in place): the
  /// windows would read other tokens, and a page past a shortened end would end the process with
  /// SIGBUS. A file replaced by a rename or deleted is fine (the mapping keeps the old one). One
  /// stat(2); TokenData::batch calls it for each shard a batch reads.
  void checkUnchanged() const;

 private:
  void release() noexcept;

  std::string path_;
  void* map_ = nullptr;            // the whole file
  size_t mapBytes_ = 0;
  const unsigned char* tokens_ = nullptr;  // first token, after any header
  int64_t size_ = 0;
  TokenFormat format_ = TokenFormat::kRawUint16;
  int bytesPerToken_ = 2;
  uint64_t device_ = 0, inode_ = 0;  // the file mapped, as fstat saw it at open
  int64_t mtimeNs_ = 0;
};

/// x: the windows' first blockSize tokens, y: the same shifted by one (the next-token targets);
/// both int64 CPU tensors [windows, blockSize], contiguous (nanoGPT's get_batch).
struct TokenBatch {
  at::Tensor x;
  at::Tensor y;
};

/// The shards of a data set, in order, seen as one sequence of tokens: a window is named by its
/// start in that sequence (shard s's tokens begin at shardStart(s)). A window never crosses a
/// shard's end. Move-only; const methods may be called from several threads at once.
class TokenData {
 public:
  /// The files `pattern` matches (glob(3): *, ?, [...]), sorted by name, each a TokenShard.
  /// DataError when nothing matches, naming the pattern and `setting` (where it came from, e.g.
  /// "data.train_files"), or when a shard is malformed (TokenShard's errors).
  TokenData(const std::string& pattern, const std::string& setting);
  /// The given shards, in this order (ConfigError when there is none).
  explicit TokenData(std::vector<TokenShard> shards);

  const std::vector<TokenShard>& shards() const { return shards_; }
  /// The glob the shards came from ("" for the second constructor).
  const std::string& pattern() const { return pattern_; }
  /// Tokens of all shards.
  int64_t totalTokens() const { return shardStarts_.back(); }
  /// Where shard `s`'s tokens begin in the sequence of all shards; shardStart(size) = totalTokens().
  int64_t shardStart(size_t s) const { return shardStarts_.at(s); }
  /// The shard holding the token at `start` of the whole sequence (ConfigError when out of range).
  size_t shardOf(int64_t start) const;

  /// TokenShard::checkVocabulary on every shard, in order: the first offending file and position.
  void checkVocabulary(int64_t vocabSize, const std::string& setting = "the vocabulary size") const;
  /// TokenShard::checkBlockSize on every shard: a shard too short for one window is an error.
  void checkBlockSize(int64_t blockSize, const std::string& setting = "the block size") const;

  /// The windows of blockSize + 1 tokens at `starts` (positions in the whole sequence), as x and y
  /// [starts.size(), blockSize]. ConfigError for a window that crosses a shard's end; DataError for a
  /// shard changed in place since it was opened (TokenShard::checkUnchanged).
  TokenBatch batch(const std::vector<int64_t>& starts, int64_t blockSize) const;

 private:
  std::string pattern_;
  std::vector<TokenShard> shards_;
  std::vector<int64_t> shardStarts_;  // shards_.size() + 1 prefix sums of the sizes
};

/// What TokenSampler draws: B windows of T + 1 tokens per rank per step, from `rank` of `world`.
struct TokenSamplerOptions {
  int64_t batchSize = 12;    // B: windows per rank per step (nanoGPT's batch_size, llm.c's B)
  int64_t blockSize = 1024;  // T: tokens per window, plus the one that ends y
  int rank = 0;              // this rank of `world`
  int world = 1;             // ranks drawing windows
  uint64_t seed = 1337;      // random: with (rank, step), the only source of the draws
  TokenSampling sampling = TokenSampling::kRandom;
};

/// The windows of each step for one rank. A step is one next() (with gradient accumulation, one
/// micro-batch: seek() then takes micro-batches done, not optimizer steps, as its globalStep).
/// An epoch is a list of epochRows() rows (windows);
/// a step consumes rowsPerStep() = world × B of them, rank r taking B; the epoch ends when fewer
/// than rowsPerStep() are left (dropped, as drop_last). The position (epoch, rows consumed, global
/// step) is what a checkpoint records (TrainPosition's epoch, epochSamples, and globalStep, or
/// microSteps under gradient accumulation), and seek() resumes from it, at this or another world
/// size.
///
/// kSequential (llm.c's DataLoader order): the rows are every shard's windows in order, row i of a
/// shard = its tokens [i·T, i·T + T + 1), floor((ntok - 1) / T) rows per shard; a step takes the next
/// world × B rows, rank r the B starting r × B in (within a shard: B·T + 1 tokens at r·B·T, advancing
/// by world·B·T, as llm.c). Every row of an epoch is used once over all ranks, at any world size.
/// Unlike llm.c, a shard's last rows short of a whole step are not skipped: the step continues in
/// the next shard, so the epoch is the same list at every world size.
///
/// kRandom (nanoGPT's get_batch): the B starts of (rank, step) are drawn uniformly over every
/// valid start of every shard (ntok_s - T per shard, in shard order): a CPU generator seeded with
/// drawSeed(seed, rank, step) draws at::randint(validStarts(), {B}) (Python:
/// torch.randint(n, (B,), generator=torch.Generator().manual_seed(drawSeed))), a draw d mapping to
/// the shard whose starts hold it. nanoGPT has no epochs: epochRows() = floor(total tokens / T), so
/// stepsPerEpoch() = floor(total / (world·B·T)), and at least one step: a corpus shorter than a
/// step's windows is sampled as nanoGPT samples it (windows overlapping), an epoch being one step.
class TokenSampler {
 public:
  /// Checks the options (ConfigError), that every shard holds blockSize + 1 tokens and, kSequential,
  /// that an epoch holds one step (DataError), and advises the shards' pages for the sampling.
  TokenSampler(std::shared_ptr<const TokenData> data, TokenSamplerOptions options);

  const TokenSamplerOptions& options() const { return options_; }
  const TokenData& data() const { return *data_; }

  /// Rows (windows) in an epoch, all ranks.
  int64_t epochRows() const { return epochRows_; }
  /// world × batchSize.
  int64_t rowsPerStep() const { return options_.batchSize * options_.world; }
  /// floor(epochRows() / rowsPerStep()).
  int64_t stepsPerEpoch() const { return epochRows_ / rowsPerStep(); }
  /// Steps left in an epoch once `rowsConsumed` of its rows are consumed.
  int64_t stepsFrom(int64_t rowsConsumed) const;
  /// kRandom: the number of valid window starts, sum of (ntok_s - T); what a draw ranges over.
  int64_t validStarts() const { return validStarts_.back(); }
  /// The generator seed of (seed, rank, step): splitmix64(splitmix64(splitmix64(seed) ^ rank) ^
  /// step), splitmix64(x) being Steele et al.'s finaliser of x + 0x9E3779B97F4A7C15 (as in Java's
  /// SplittableRandom). The CPU generator (mt19937) keys on its low 32 bits, in C++ and Python alike.
  static uint64_t drawSeed(uint64_t seed, int rank, int64_t step);

  /// This rank's B window starts (positions in data()'s sequence) for the step that begins once
  /// `rowsConsumed` rows of the epoch are consumed and is the run's `globalStep`-th step (from 0).
  /// kSequential reads `rowsConsumed` only, kRandom `globalStep` only. A pure function.
  std::vector<int64_t> windowStarts(int64_t rowsConsumed, int64_t globalStep) const;

  /// Moves the cursor: `rowsConsumed` rows of `epoch` consumed (TrainPosition::epochSamples, at any
  /// world size), `globalStep` steps taken in all (ConfigError for negative values or more rows
  /// than the epoch holds).
  void seek(int64_t epoch, int64_t rowsConsumed, int64_t globalStep);
  /// The batch at the cursor, then moves it one step on. When the epoch has no step left, the next
  /// epoch begins first (rows consumed back to 0, epoch + 1), as llm.c's loader wraps around.
  TokenBatch next();
  int64_t epoch() const { return epoch_; }
  /// Rows of epoch() consumed, all ranks: TrainPosition::epochSamples.
  int64_t rowsConsumed() const { return rowsConsumed_; }
  /// Steps taken in all (next() calls, counting from seek's globalStep): TrainPosition::globalStep.
  int64_t globalStep() const { return globalStep_; }
  /// Steps of this world size that the rows consumed make: TrainPosition::stepInEpoch (exact when
  /// the epoch ran at this world size).
  int64_t stepInEpoch() const { return rowsConsumed_ / rowsPerStep(); }
  /// Steps left in epoch() from the cursor.
  int64_t stepsLeftInEpoch() const { return stepsFrom(rowsConsumed_); }
  /// rowsConsumed() once `steps` more steps are taken in this epoch, at most epochRows(): the
  /// epochSamples to record after them.
  int64_t rowsAfter(int64_t steps) const;

 private:
  std::vector<int64_t> sequentialStarts(int64_t rowsConsumed) const;
  std::vector<int64_t> randomStarts(int64_t globalStep) const;

  std::shared_ptr<const TokenData> data_;
  TokenSamplerOptions options_;
  std::vector<int64_t> rowStarts_;    // kSequential: prefix sums of the shards' rows
  std::vector<int64_t> validStarts_;  // prefix sums of the shards' valid starts (ntok - T)
  int64_t epochRows_ = 0;
  int64_t epoch_ = 0;
  int64_t rowsConsumed_ = 0;
  int64_t globalStep_ = 0;
};

/// A character-level vocabulary as nanoGPT's data/shakespeare_char/prepare.py pickles it beside its
/// train.bin and val.bin (meta.pkl: {'vocab_size': 65, 'itos': {0: '\n', ...}, 'stoi': {...}}).
struct CharVocabulary {
  int64_t vocabSize = 0;
  std::vector<std::string> itos;  // token i's text (UTF-8), for i < vocabSize
};

/// Reads nanoGPT's meta.pkl (pickle protocol 2 to 5; no Python needed). DataError, one line naming
/// the file: not a pickle or a damaged one, no integer 'vocab_size' > 0, or an 'itos' that does not
/// give every token 0 .. vocab_size - 1 a string.
CharVocabulary readNanoGptMeta(const std::string& path);

}  // namespace ddp
