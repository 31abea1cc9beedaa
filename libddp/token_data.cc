#include "ddp/token_data.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randint.h>
#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "common/error.h"
#include "common/relative_path.h"
#include "libddp/checkpoint/torch_file.h"

namespace ddp {
namespace {

constexpr int32_t kMagicUint16 = 20240520;  // llm.c's GPT-2 shards (dev/data/data_common.py)
constexpr int32_t kMagicUint32 = 20240801;  // llm.c's Llama 3 shards
constexpr int64_t kHeaderInts = 256;
constexpr int64_t kHeaderBytes = kHeaderInts * 4;
constexpr const char* kRecreate = "re-create it (scripts/prepare_text.py, or llm.c's dev/data scripts)";

struct Layout {
  TokenFormat format = TokenFormat::kRawUint16;
  int bytesPerToken = 2;
  int64_t headerBytes = 0;
  int64_t tokens = 0;
};

int32_t headerInt(const unsigned char* base, int i) {
  int32_t v = 0;
  std::memcpy(&v, base + 4 * i, sizeof v);  // llm.c writes the host's (little-endian) int32
  return v;
}

// An llm.c shard: the magic names the token width, the version must be the magic's, and the file
// must hold exactly the header and the header's count of tokens.
Layout llmcLayout(const std::string& path, const unsigned char* base, int64_t fileBytes, int32_t magic) {
  const bool wide = magic == kMagicUint32;
  const int32_t want = wide ? 7 : 1;
  if (fileBytes < kHeaderBytes) {
    DDP_THROW(DataError, "token shard '", path, "' is truncated: ", fileBytes, " bytes, less than llm.c's ",
              kHeaderBytes, "-byte header (magic ", magic, "): ", kRecreate);
  }
  const int32_t version = headerInt(base, 1);
  if (version != want) {
    DDP_THROW(DataError, "token shard '", path, "': llm.c magic ", magic, " with version ", version,
              ", but that magic goes with version ", want, " (", wide ? "uint32" : "uint16", " tokens): ", kRecreate);
  }
  Layout layout{wide ? TokenFormat::kLlmcUint32 : TokenFormat::kLlmcUint16, wide ? 4 : 2, kHeaderBytes, headerInt(base, 2)};
  const int64_t body = fileBytes - kHeaderBytes;
  const int64_t held = body / layout.bytesPerToken;
  if (layout.tokens < 0 || body != layout.tokens * layout.bytesPerToken) {
    const int64_t spare = body % layout.bytesPerToken;
    DDP_THROW(DataError, "token shard '", path, "': its llm.c header says ", layout.tokens, " tokens but the file holds ",
              held, spare != 0 ? detail::concat(" and ", spare, " byte(s)") : std::string(), " after the ",
              kHeaderBytes, "-byte header (", fileBytes, " bytes, ", layout.bytesPerToken, " per token): the file is ",
              held < layout.tokens ? "truncated" : "longer than its header says", "; ", kRecreate);
  }
  return layout;
}

// An llm.c header under another magic: version 1 or 7 and a count that fills the file exactly at that
// version's width (raw tokens matching all three by chance is not a real risk).
void refuseUnknownMagic(const std::string& path, const unsigned char* base, int64_t fileBytes) {
  if (fileBytes < kHeaderBytes) return;
  const int32_t version = headerInt(base, 1);
  const int64_t count = headerInt(base, 2);
  const int64_t width = version == 1 ? 2 : version == 7 ? 4 : 0;
  if (width == 0 || count <= 0 || fileBytes - kHeaderBytes != count * width) return;
  DDP_THROW(DataError, "token shard '", path, "' has an llm.c header (version ", version, ", ", count,
            " tokens, the file's size) with magic ", headerInt(base, 0), ", not ", kMagicUint16, " (uint16) or ",
            kMagicUint32, " (uint32): ", kRecreate);
}

// llm.c's magic in the first int32 makes an llm.c shard; anything else is nanoGPT's raw uint16.
Layout layoutOf(const std::string& path, const unsigned char* base, int64_t fileBytes) {
  if (fileBytes >= 4) {
    const int32_t magic = headerInt(base, 0);
    if (magic == kMagicUint16 || magic == kMagicUint32) return llmcLayout(path, base, fileBytes, magic);
  }
  refuseUnknownMagic(path, base, fileBytes);
  if (fileBytes % 2 != 0) {
    DDP_THROW(DataError, "token shard '", path, "' has ", fileBytes,
              " bytes, not a whole number of uint16 tokens (a raw nanoGPT .bin: no llm.c magic ", kMagicUint16, " or ",
              kMagicUint32, " at its start): the file is truncated; ", kRecreate);
  }
  return Layout{TokenFormat::kRawUint16, 2, 0, fileBytes / 2};
}

template <typename T>
void widen(const unsigned char* tokens, int64_t start, int64_t n, int64_t* out) {
  const T* src = reinterpret_cast<const T*>(tokens) + start;
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int64_t>(src[i]);
}

// A chunk's maximum first (a loop the compiler vectorises), the position only in the chunk that has one.
template <typename T>
int64_t firstAtLeast(const unsigned char* tokens, int64_t n, int64_t bound) {
  constexpr int64_t kChunk = 1 << 16;
  const T* src = reinterpret_cast<const T*>(tokens);
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t end = std::min(n, begin + kChunk);
    T top = 0;
    for (int64_t i = begin; i < end; ++i) top = std::max(top, src[i]);
    if (static_cast<int64_t>(top) < bound) continue;
    for (int64_t i = begin; i < end; ++i) {
      if (static_cast<int64_t>(src[i]) >= bound) return i;
    }
  }
  return -1;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

std::vector<std::string> globSorted(const std::string& pattern, const std::string& setting) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0) paths.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  ::globfree(&g);
  if (rc != 0 && rc != GLOB_NOMATCH) {
    DDP_THROW(DataError, setting, ": could not list '", pattern, "' (glob error ", rc, "): check the pattern and its directory");
  }
  if (paths.empty()) {
    DDP_THROW(DataError, setting, ": no file matches '", pattern, "'", relativePathNote(pattern),
              ": fix the pattern, or prepare the shards first (scripts/prepare_text.py INPUT... --out DIR)");
  }
  std::sort(paths.begin(), paths.end());  // by bytes, whatever the locale's collation
  return paths;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// TokenShard

TokenShard::TokenShard(const std::string& path) : path_(path) {
  // O_NONBLOCK: a named pipe matched by the glob is refused below instead of blocking the open until
  // something writes to it (no effect on a regular file).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    DDP_THROW(DataError, "token shard '", path, "': cannot open it (", std::strerror(errno), "): check the path");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    DDP_THROW(DataError, "token shard '", path, "' is not a regular file: point the pattern at the shard files");
  }
  if (st.st_size == 0) {
    ::close(fd);
    DDP_THROW(DataError, "token shard '", path, "' is empty (0 bytes): ", kRecreate);
  }
  void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  const int mapErrno = errno;
  ::close(fd);  // the mapping keeps the file
  if (map == MAP_FAILED) {
    DDP_THROW(DataError, "token shard '", path, "': cannot map its ", st.st_size, " bytes (", std::strerror(mapErrno),
              "): check the memory limits (ulimit -v)");
  }
  map_ = map;
  mapBytes_ = static_cast<size_t>(st.st_size);
  device_ = static_cast<uint64_t>(st.st_dev);
  inode_ = static_cast<uint64_t>(st.st_ino);
  mtimeNs_ = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  try {
    const auto* base = static_cast<const unsigned char*>(map_);
    const Layout layout = layoutOf(path, base, st.st_size);
    if (layout.tokens == 0) DDP_THROW(DataError, "token shard '", path, "' holds no tokens (an llm.c header alone): ", kRecreate);
    tokens_ = base + layout.headerBytes;
    size_ = layout.tokens;
    format_ = layout.format;
    bytesPerToken_ = layout.bytesPerToken;
  } catch (...) {
    release();
    throw;
  }
}

TokenShard::~TokenShard() { release(); }

TokenShard::TokenShard(TokenShard&& other) noexcept { *this = std::move(other); }

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    mapBytes_ = std::exchange(other.mapBytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    size_ = std::exchange(other.size_, 0);
    format_ = other.format_;
    bytesPerToken_ = other.bytesPerToken_;
    device_ = other.device_;
    inode_ = other.inode_;
    mtimeNs_ = other.mtimeNs_;
  }
  return *this;
}

void TokenShard::release() noexcept {
  if (map_ != nullptr) ::munmap(map_, mapBytes_);
  map_ = nullptr;
  mapBytes_ = 0;
  tokens_ = nullptr;
}

int64_t TokenShard::at(int64_t i) const {
  int64_t token = 0;
  read(i, 1, &token);
  return token;
}

void TokenShard::read(int64_t start, int64_t n, int64_t* out) const {
  if (start < 0 || n < 0 || start > size_ - n) {
    DDP_THROW(ConfigError, "ddp::TokenShard::read: tokens [", start, ", ", start + n, ") are outside '", path_, "' (",
              size_, " tokens)");
  }
  if (bytesPerToken_ == 4) {
    widen<uint32_t>(tokens_, start, n, out);
  } else {
    widen<uint16_t>(tokens_, start, n, out);
  }
}

at::Tensor TokenShard::tokens(int64_t start, int64_t n) const {
  at::Tensor out = at::empty({std::max<int64_t>(n, 0)}, at::TensorOptions().dtype(at::kLong));
  read(start, n, out.data_ptr<int64_t>());
  return out;
}

int64_t TokenShard::firstTokenAtLeast(int64_t bound) const {
  const int64_t largest = bytesPerToken_ == 4 ? int64_t{std::numeric_limits<uint32_t>::max()}
                                              : int64_t{std::numeric_limits<uint16_t>::max()};
  if (bound > largest) return -1;  // no token of this width reaches it: nothing to read
  if (bytesPerToken_ == 4) return firstAtLeast<uint32_t>(tokens_, size_, bound);
  return firstAtLeast<uint16_t>(tokens_, size_, bound);
}

void TokenShard::checkVocabulary(int64_t vocabSize, const std::string& setting) const {
  if (vocabSize < 1) DDP_THROW(ConfigError, setting, " must be >= 1 (got ", vocabSize, ")");
  const int64_t pos = firstTokenAtLeast(vocabSize);
  if (pos < 0) return;
  DDP_THROW(DataError, "token shard '", path_, "': token ", at(pos), " at position ", pos, " is >= ", setting, " ",
            vocabSize, " (the first such token): prepare the data with this vocabulary, or raise ", setting);
}

void TokenShard::checkBlockSize(int64_t blockSize, const std::string& setting) const {
  if (blockSize < 1) DDP_THROW(ConfigError, setting, " must be >= 1 (got ", blockSize, ")");
  if (size_ >= blockSize + 1) return;
  DDP_THROW(DataError, "token shard '", path_, "' holds ", size_, " tokens, fewer than ", setting, " + 1 = ",
            blockSize + 1, ": no window fits in it; lower ", setting, ", or merge it into a bigger shard");
}

void TokenShard::advise(TokenSampling sampling) const {
  // A hint only: a kernel that refuses it reads the pages all the same.
  (void)::madvise(map_, mapBytes_, sampling == TokenSampling::kRandom ? MADV_RANDOM : MADV_SEQUENTIAL);
}

void TokenShard::checkUnchanged() const {
  struct stat st {};
  // Gone, or another file under the name (a rename over it): the mapping still holds the one opened.
  if (::stat(path_.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_dev) != device_ ||
      static_cast<uint64_t>(st.st_ino) != inode_) {
    return;
  }
  const int64_t mtimeNs = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  if (static_cast<size_t>(st.st_size) == mapBytes_ && mtimeNs == mtimeNs_) return;
  DDP_THROW(DataError, "token shard '", path_, "' was changed in place while this job read it (", mapBytes_,
            " bytes when opened, ", st.st_size, " now", mtimeNs == mtimeNs_ ? "" : ", modified since",
            "): its windows would be other tokens, or past a shortened end a SIGBUS; write new shards to another "
            "folder, or to a temporary name renamed over the old one (as scripts/prepare_text.py does), and "
            "resume from the last checkpoint");
}

// ---------------------------------------------------------------------------------------------
// TokenData

TokenData::TokenData(const std::string& pattern, const std::string& setting) : pattern_(pattern) {
  for (const auto& path : globSorted(pattern, setting)) shards_.emplace_back(path);
  shardStarts_.assign(1, 0);
  for (const auto& shard : shards_) shardStarts_.push_back(shardStarts_.back() + shard.size());
}

TokenData::TokenData(std::vector<TokenShard> shards) : shards_(std::move(shards)) {
  if (shards_.empty()) DDP_THROW(ConfigError, "ddp::TokenData: no shards given");
  shardStarts_.assign(1, 0);
  for (const auto& shard : shards_) shardStarts_.push_back(shardStarts_.back() + shard.size());
}

size_t TokenData::shardOf(int64_t start) const {
  if (start < 0 || start >= totalTokens()) {
    DDP_THROW(ConfigError, "ddp::TokenData: position ", start, " is outside the data (", totalTokens(), " tokens)");
  }
  // The last shard whose start is <= `start` (an empty shard cannot exist: TokenShard refuses it).
  const auto it = std::upper_bound(shardStarts_.begin(), shardStarts_.end(), start);
  return static_cast<size_t>(it - shardStarts_.begin()) - 1;
}

void TokenData::checkVocabulary(int64_t vocabSize, const std::string& setting) const {
  for (const auto& shard : shards_) shard.checkVocabulary(vocabSize, setting);
}

void TokenData::checkBlockSize(int64_t blockSize, const std::string& setting) const {
  for (const auto& shard : shards_) shard.checkBlockSize(blockSize, setting);
}

TokenBatch TokenData::batch(const std::vector<int64_t>& starts, int64_t blockSize) const {
  if (blockSize < 1) DDP_THROW(ConfigError, "ddp::TokenData::batch: blockSize must be >= 1 (got ", blockSize, ")");
  const auto rows = static_cast<int64_t>(starts.size());
  const auto options = at::TensorOptions().dtype(at::kLong);
  TokenBatch batch{at::empty({rows, blockSize}, options), at::empty({rows, blockSize}, options)};
  int64_t* x = batch.x.data_ptr<int64_t>();
  int64_t* y = batch.y.data_ptr<int64_t>();
  size_t checked = shards_.size();  // the shard last checked unchanged (sequential windows share one)
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t start = starts[static_cast<size_t>(i)];
    const size_t s = shardOf(start);
    const TokenShard& shard = shards_[s];
    if (s != checked) {
      shard.checkUnchanged();
      checked = s;
    }
    const int64_t offset = start - shardStarts_[s];
    if (offset + blockSize + 1 > shard.size()) {
      DDP_THROW(ConfigError, "ddp::TokenData::batch: the window of ", blockSize + 1, " tokens at ", start,
                " crosses the end of '", shard.path(), "' (token ", offset, " of ", shard.size(), ")");
    }
    shard.read(offset, blockSize, x + i * blockSize);
    shard.read(offset + 1, blockSize, y + i * blockSize);
  }
  return batch;
}

// ---------------------------------------------------------------------------------------------
// TokenSampler

namespace {

void checkOptions(const TokenSamplerOptions& o) {
  if (o.batchSize < 1) DDP_THROW(ConfigError, "ddp::TokenSamplerOptions::batchSize must be >= 1 (got ", o.batchSize, ")");
  if (o.blockSize < 1) DDP_THROW(ConfigError, "ddp::TokenSamplerOptions::blockSize must be >= 1 (got ", o.blockSize, ")");
  if (o.world < 1) DDP_THROW(ConfigError, "ddp::TokenSamplerOptions::world must be >= 1 (got ", o.world, ")");
  if (o.rank < 0 || o.rank >= o.world) {
    DDP_THROW(ConfigError, "ddp::TokenSamplerOptions::rank must be in [0, world = ", o.world, ") (got ", o.rank, ")");
  }
  if (!parseTokenSampling(tokenSamplingName(o.sampling))) {
    DDP_THROW(ConfigError, "ddp::TokenSamplerOptions::sampling is ", static_cast<int>(o.sampling), ", not a TokenSampling");
  }
}

}  // namespace

TokenSampler::TokenSampler(std::shared_ptr<const TokenData> data, TokenSamplerOptions options)
    : data_(std::move(data)), options_(options) {
  if (!data_) DDP_THROW(ConfigError, "ddp::TokenSampler: the data is null");
  checkOptions(options_);
  const int64_t t = options_.blockSize;
  data_->checkBlockSize(t, "the block size");
  rowStarts_.assign(1, 0);
  validStarts_.assign(1, 0);
  for (const auto& shard : data_->shards()) {
    rowStarts_.push_back(rowStarts_.back() + (shard.size() - 1) / t);  // llm.c: B·T + 1 read, B·T moved
    validStarts_.push_back(validStarts_.back() + shard.size() - t);    // nanoGPT: randint(len - T)
  }
  // Random windows may overlap (nanoGPT draws them from a corpus of any length): an epoch is one step at least.
  epochRows_ = options_.sampling == TokenSampling::kSequential ? rowStarts_.back()
                                                                : std::max(data_->totalTokens() / t, rowsPerStep());
  if (stepsPerEpoch() < 1) {
    DDP_THROW(DataError, "token data '", data_->pattern(), "': an epoch holds ", epochRows_, " windows of ", t,
              " + 1 tokens, fewer than one step takes (world ", options_.world, " x batch ", options_.batchSize,
              " = ", rowsPerStep(), "): use more data, or a smaller batch size, block size or world size");
  }
  for (const auto& shard : data_->shards()) shard.advise(options_.sampling);
}

int64_t TokenSampler::stepsFrom(int64_t rowsConsumed) const {
  return rowsConsumed >= epochRows_ ? 0 : (epochRows_ - rowsConsumed) / rowsPerStep();
}

uint64_t TokenSampler::drawSeed(uint64_t seed, int rank, int64_t step) {
  return splitmix64(splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(rank)) ^ static_cast<uint64_t>(step));
}

std::vector<int64_t> TokenSampler::windowStarts(int64_t rowsConsumed, int64_t globalStep) const {
  if (options_.sampling == TokenSampling::kRandom) return randomStarts(globalStep);
  return sequentialStarts(rowsConsumed);
}

std::vector<int64_t> TokenSampler::sequentialStarts(int64_t rowsConsumed) const {
  if (rowsConsumed < 0 || stepsFrom(rowsConsumed) < 1) {
    DDP_THROW(ConfigError, "ddp::TokenSampler: no step begins at row ", rowsConsumed, " of an epoch of ", epochRows_,
              " rows (", rowsPerStep(), " a step)");
  }
  const int64_t t = options_.blockSize;
  const int64_t first = rowsConsumed + options_.rank * options_.batchSize;
  std::vector<int64_t> starts;
  starts.reserve(static_cast<size_t>(options_.batchSize));
  for (int64_t row = first; row < first + options_.batchSize; ++row) {
    const auto it = std::upper_bound(rowStarts_.begin(), rowStarts_.end(), row);
    const auto s = static_cast<size_t>(it - rowStarts_.begin()) - 1;
    starts.push_back(data_->shardStart(s) + (row - rowStarts_[s]) * t);
  }
  return starts;
}

std::vector<int64_t> TokenSampler::randomStarts(int64_t globalStep) const {
  if (globalStep < 0) DDP_THROW(ConfigError, "ddp::TokenSampler: globalStep must be >= 0 (got ", globalStep, ")");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(drawSeed(options_.seed, options_.rank, globalStep));
  const at::Tensor draws = at::randint(validStarts(), {options_.batchSize}, gen, at::TensorOptions().dtype(at::kLong));
  const int64_t* d = draws.data_ptr<int64_t>();
  std::vector<int64_t> starts;
  starts.reserve(static_cast<size_t>(options_.batchSize));
  for (int64_t i = 0; i < options_.batchSize; ++i) {
    // Shard s holds the draws [validStarts_[s], validStarts_[s + 1]).
    const auto it = std::upper_bound(validStarts_.begin(), validStarts_.end(), d[i]);
    const auto s = static_cast<size_t>(it - validStarts_.begin()) - 1;
    starts.push_back(data_->shardStart(s) + d[i] - validStarts_[s]);
  }
  return starts;
}

void TokenSampler::seek(int64_t epoch, int64_t rowsConsumed, int64_t globalStep) {
  if (epoch < 0 || globalStep < 0 || rowsConsumed < 0 || rowsConsumed > epochRows_) {
    DDP_THROW(ConfigError, "ddp::TokenSampler::seek(epoch ", epoch, ", rows ", rowsConsumed, ", step ", globalStep,
              "): the epoch and step must be >= 0 and the rows in [0, ", epochRows_, "]");
  }
  epoch_ = epoch;
  rowsConsumed_ = rowsConsumed;
  globalStep_ = globalStep;
}

TokenBatch TokenSampler::next() {
  if (stepsFrom(rowsConsumed_) < 1) {
    ++epoch_;
    rowsConsumed_ = 0;
  }
  TokenBatch batch = data_->batch(windowStarts(rowsConsumed_, globalStep_), options_.blockSize);
  rowsConsumed_ += rowsPerStep();
  ++globalStep_;
  return batch;
}

int64_t TokenSampler::rowsAfter(int64_t steps) const {
  if (steps < 0) DDP_THROW(ConfigError, "ddp::TokenSampler::rowsAfter: steps must be >= 0 (got ", steps, ")");
  return std::min(epochRows_, rowsConsumed_ + steps * rowsPerStep());
}

CharVocabulary readNanoGptMeta(const std::string& path) {
  using checkpoint::PyValue;
  checkpoint::PyValuePtr meta;
  try {
    meta = checkpoint::readPickleFile(path);
  } catch (const CheckpointError& e) {
    DDP_THROW(DataError, "nanoGPT vocabulary: ", e.what());
  }
  const PyValue* size = meta->get("vocab_size");
  if (size == nullptr || size->kind != PyValue::Kind::kInt || size->integer <= 0) {
    DDP_THROW(DataError, "nanoGPT vocabulary: '", path, "' has no vocab_size > 0 (a dict {'vocab_size', 'itos', "
              "'stoi'} as nanoGPT's data/shakespeare_char/prepare.py pickles it)");
  }
  CharVocabulary out;
  out.vocabSize = size->integer;
  const PyValue* itos = meta->get("itos");
  if (itos == nullptr || itos->kind != PyValue::Kind::kDict) {
    DDP_THROW(DataError, "nanoGPT vocabulary: '", path, "' has no 'itos' dict (token -> character)");
  }
  out.itos.resize(static_cast<size_t>(out.vocabSize));
  std::vector<bool> seen(out.itos.size(), false);
  for (const auto& [key, value] : itos->entries) {
    if (key->kind != PyValue::Kind::kInt || key->integer < 0 || key->integer >= out.vocabSize) {
      DDP_THROW(DataError, "nanoGPT vocabulary: '", path, "': 'itos' has the key ",
                key->kind == PyValue::Kind::kInt ? std::to_string(key->integer) : std::string("'").append(key->text).append("'"),
                ", not a token of 0 .. ", out.vocabSize - 1, " (vocab_size ", out.vocabSize, ")");
    }
    if (value->kind != PyValue::Kind::kString) {
      DDP_THROW(DataError, "nanoGPT vocabulary: '", path, "': 'itos' gives token ", key->integer, " no string");
    }
    out.itos[static_cast<size_t>(key->integer)] = value->text;
    seen[static_cast<size_t>(key->integer)] = true;
  }
  const auto missing = std::find(seen.begin(), seen.end(), false);
  if (missing != seen.end()) {
    DDP_THROW(DataError, "nanoGPT vocabulary: '", path, "': 'itos' has no text for token ", missing - seen.begin(),
              " (vocab_size ", out.vocabSize, ")");
  }
  return out;
}

}  // namespace ddp
