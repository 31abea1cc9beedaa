// Token data through libddp.so (<ddp/token_data.h>) against shards written by numpy and windows
// taken by a Python reference (tests/python/token_reference.py: nanoGPT's get_batch, llm.c's
// DataLoader): both llm.c formats and nanoGPT's raw .bin read back exactly, every malformed shard
// is one line naming the file, sequential epochs use every window once at 2 and 3 ranks and resume
// at another world size with the next unseen windows, random draws equal torch.randint's.
#include <ddp/error.h>
#include <ddp/token_data.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tests/support/run_command.h"

namespace {

constexpr int kMagic16 = 20240520;
constexpr int kMagic32 = 20240801;

// The data sets the tests use: name → (format, tokens, ...) for the writer.
nlohmann::json fileSpecs() {
  using J = nlohmann::json;
  return J::array({
      J{{"name", "gpt2.bin"}, {"magic", kMagic16}, {"version", 1}, {"n", 3000}, {"high", 50257}, {"seed", 1}},
      J{{"name", "llama.bin"}, {"magic", kMagic32}, {"version", 7}, {"dtype", "uint32"}, {"n", 2000}, {"high", 128256},
        {"seed", 2}, {"set", J::array({J::array({5, 4000000000LL})})}},
      J{{"name", "train.bin"}, {"n", 2500}, {"high", 65536}, {"seed", 3}},
      J{{"name", "multi/shard_000.bin"}, {"magic", kMagic16}, {"version", 1}, {"n", 1000}, {"high", 50257}, {"seed", 4}},
      J{{"name", "multi/shard_001.bin"}, {"n", 517}, {"high", 50257}, {"seed", 5}},
      J{{"name", "multi/shard_002.bin"}, {"magic", kMagic32}, {"version", 7}, {"dtype", "uint32"}, {"n", 263},
        {"high", 100000}, {"seed", 6}},
      J{{"name", "vocab.bin"}, {"n", 1200}, {"high", 100}, {"seed", 7}, {"set", J::array({J::array({777, 150}), J::array({900, 200})})}},
      J{{"name", "tiny.bin"}, {"magic", kMagic16}, {"version", 1}, {"n", 20}, {"high", 50}, {"seed", 8}},
      // Malformed.
      J{{"name", "bad/empty.bin"}},
      J{{"name", "bad/version.bin"}, {"magic", kMagic16}, {"version", 2}, {"n", 10}, {"high", 9}},
      J{{"name", "bad/version32.bin"}, {"magic", kMagic32}, {"version", 1}, {"dtype", "uint32"}, {"n", 10}, {"high", 9}},
      J{{"name", "bad/truncated.bin"}, {"magic", kMagic16}, {"version", 1}, {"count", 1000}, {"n", 900}, {"high", 9}},
      J{{"name", "bad/longer.bin"}, {"magic", kMagic32}, {"version", 7}, {"dtype", "uint32"}, {"count", 500}, {"n", 600}, {"high", 9}},
      J{{"name", "bad/short_header.bin"}, {"magic", kMagic16}, {"version", 1}, {"n", 10}, {"high", 9}, {"truncate_to", 100}},
      J{{"name", "bad/odd.bin"}, {"n", 10}, {"high", 9}, {"append", 1}},
      J{{"name", "bad/magic.bin"}, {"magic", 20240521}, {"version", 1}, {"n", 10}, {"high", 9}},
      J{{"name", "bad/header_only.bin"}, {"magic", kMagic16}, {"version", 1}, {"n", 0}},
  });
}

struct RandomCase {
  std::vector<std::string> files;
  int64_t block, batch;
  uint64_t seed;
  int rank;
  int64_t step;
};

const std::vector<RandomCase>& randomCases() {
  static const std::vector<RandomCase> cases = [] {
    std::vector<RandomCase> c;
    const std::vector<std::string> multi = {"multi/shard_000.bin", "multi/shard_001.bin", "multi/shard_002.bin"};
    for (uint64_t seed : {1337ULL, 7ULL, 0xFFFFFFFFFFFFULL}) {
      for (int rank : {0, 1, 2}) {
        for (int64_t step : {0, 1, 2, 3, 4, 5, 123456}) c.push_back({multi, 16, 4, seed, rank, step});
      }
    }
    for (int64_t step : {0, 1}) c.push_back({{"gpt2.bin"}, 64, 3, 42, 0, step});
    // A step's 2 x 64 windows of 16 are more than the 1780 tokens hold: nanoGPT draws them all the same.
    for (int64_t step : {0, 1}) c.push_back({multi, 16, 64, 5, 1, step});
    return c;
  }();
  return cases;
}

class TokenDataTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(ddp::test::makeTempDir("token_data"));
    nlohmann::json request = {{"dir", *dir_}, {"files", fileSpecs()}, {"random", nlohmann::json::array()},
                              {"sequential", nlohmann::json::array()}};
    for (const auto& c : randomCases()) {
      request["random"].push_back({{"files", c.files}, {"block", c.block}, {"batch", c.batch}, {"seed", c.seed},
                                   {"rank", c.rank}, {"step", c.step}});
    }
    for (int world : {2, 3}) {
      for (int rank = 0; rank < world; ++rank) {
        for (int step : {0, 1}) {
          request["sequential"].push_back(
              {{"file", "gpt2.bin"}, {"block", 16}, {"batch", 4}, {"rank", rank}, {"world", world}, {"step", step}});
        }
      }
    }
    reply_ = new nlohmann::json(askPython(request));
  }
  static void TearDownTestSuite() {
    std::error_code ignored;
    std::filesystem::remove_all(*dir_, ignored);
    delete dir_;
    delete reply_;
  }

  static nlohmann::json askPython(const nlohmann::json& request) {
    const std::string in = *dir_ + "/request.json";
    FILE* f = std::fopen(in.c_str(), "w");
    if (f == nullptr) throw std::runtime_error("cannot write " + in);
    const std::string text = request.dump();
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
    ddp::test::CommandOptions options = ddp::test::stdoutOnly();
    options.stdinPath = in;
    const auto run = ddp::test::runCommand({DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/token_reference.py"}, options);
    if (run.exitCode != 0) throw std::runtime_error("the reference failed: " + run.output);
    return nlohmann::json::parse(run.output);
  }

  static std::string path(const std::string& name) { return *dir_ + "/" + name; }
  static std::vector<int64_t> tokensOf(const std::string& name) {
    return reply_->at("tokens").at(name).get<std::vector<int64_t>>();
  }
  static std::shared_ptr<const ddp::TokenData> multi() {
    return std::make_shared<const ddp::TokenData>(path("multi/shard_*.bin"), "data.train_files");
  }
  // The whole sequence of the multi/ shards, as the reference wrote them.
  static std::vector<int64_t> multiTokens() {
    std::vector<int64_t> all;
    for (const char* name : {"multi/shard_000.bin", "multi/shard_001.bin", "multi/shard_002.bin"}) {
      const auto t = tokensOf(name);
      all.insert(all.end(), t.begin(), t.end());
    }
    return all;
  }

  static std::string* dir_;
  static nlohmann::json* reply_;
};
std::string* TokenDataTest::dir_ = nullptr;
nlohmann::json* TokenDataTest::reply_ = nullptr;

std::vector<int64_t> toVector(const at::Tensor& t) {
  const int64_t* p = t.data_ptr<int64_t>();
  return {p, p + t.numel()};
}

// Row r of x (or y) of a [rows, T] batch.
std::vector<int64_t> rowOf(const at::Tensor& t, int64_t r) {
  const int64_t cols = t.size(1);
  const int64_t* p = t.data_ptr<int64_t>() + r * cols;
  return {p, p + cols};
}

std::vector<int64_t> slice(const std::vector<int64_t>& v, int64_t start, int64_t n) {
  return {v.begin() + start, v.begin() + start + n};
}

// The DataError `f` throws (a failure if it throws none, or another kind).
std::string dataErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const ddp::DataError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << "not one line: " << what;
    return what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a DataError: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no error";
  return "";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST_F(TokenDataTest, ReadsBothLlmcFormatsAndNanoGptsRawBinExactly) {
  const struct {
    const char* name;
    ddp::TokenFormat format;
    int bytes;
  } cases[] = {{"gpt2.bin", ddp::TokenFormat::kLlmcUint16, 2},
               {"llama.bin", ddp::TokenFormat::kLlmcUint32, 4},
               {"train.bin", ddp::TokenFormat::kRawUint16, 2}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const ddp::TokenShard shard(path(c.name));
    const auto want = tokensOf(c.name);
    EXPECT_EQ(shard.path(), path(c.name));
    EXPECT_EQ(shard.format(), c.format);
    EXPECT_EQ(shard.bytesPerToken(), c.bytes);
    ASSERT_EQ(shard.size(), static_cast<int64_t>(want.size()));
    EXPECT_EQ(toVector(shard.tokens(0, shard.size())), want);
    EXPECT_EQ(toVector(shard.tokens(17, 5)), slice(want, 17, 5));
    EXPECT_EQ(shard.at(shard.size() - 1), want.back());
    EXPECT_THROW(shard.tokens(shard.size() - 2, 3), ddp::ConfigError);
  }
  EXPECT_EQ(ddp::TokenShard(path("llama.bin")).at(5), 4000000000LL);  // beyond int32 and uint16
}

TEST_F(TokenDataTest, EveryMalformedShardIsOneLineNamingTheFileAndTheFix) {
  const auto errorOf = [](const std::string& name) { return dataErrorOf([&] { ddp::TokenShard shard(path(name)); }); };
  std::string e = errorOf("bad/empty.bin");
  EXPECT_TRUE(has(e, path("bad/empty.bin")) && has(e, "is empty (0 bytes)") && has(e, "re-create it")) << e;
  e = errorOf("bad/version.bin");
  EXPECT_TRUE(has(e, path("bad/version.bin")) && has(e, "magic 20240520 with version 2") && has(e, "version 1")) << e;
  e = errorOf("bad/version32.bin");
  EXPECT_TRUE(has(e, "magic 20240801 with version 1") && has(e, "version 7 (uint32 tokens)")) << e;
  e = errorOf("bad/truncated.bin");
  EXPECT_TRUE(has(e, path("bad/truncated.bin")) && has(e, "header says 1000 tokens") && has(e, "holds 900") &&
              has(e, "truncated"))
      << e;
  e = errorOf("bad/longer.bin");
  EXPECT_TRUE(has(e, "header says 500 tokens") && has(e, "holds 600") && has(e, "longer than its header says")) << e;
  e = errorOf("bad/short_header.bin");
  EXPECT_TRUE(has(e, path("bad/short_header.bin")) && has(e, "truncated: 100 bytes") && has(e, "1024-byte header")) << e;
  e = errorOf("bad/odd.bin");
  EXPECT_TRUE(has(e, path("bad/odd.bin")) && has(e, "21 bytes") && has(e, "not a whole number of uint16 tokens")) << e;
  e = errorOf("bad/magic.bin");
  EXPECT_TRUE(has(e, path("bad/magic.bin")) && has(e, "with magic 20240521, not 20240520 (uint16) or 20240801")) << e;
  e = errorOf("bad/header_only.bin");
  EXPECT_TRUE(has(e, path("bad/header_only.bin")) && has(e, "holds no tokens")) << e;
  e = errorOf("missing.bin");
  EXPECT_TRUE(has(e, path("missing.bin")) && has(e, "cannot open")) << e;
  e = errorOf("multi");
  EXPECT_TRUE(has(e, "not a regular file")) << e;
  // Through a glob: the first malformed file stops it.
  e = dataErrorOf([] { ddp::TokenData data(path("bad/e*.bin"), "data.train_files"); });
  EXPECT_TRUE(has(e, path("bad/empty.bin"))) << e;
}

// A named pipe the glob matches is refused at once: a blocking open would wait for ever for a writer.
TEST_F(TokenDataTest, ANamedPipeIsRefusedWithoutWaitingForAWriter) {
  const std::string fifo = path("pipe_000000.bin");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string e = dataErrorOf([&] { ddp::TokenData data(path("pipe_*.bin"), "data.train_files"); });
  std::filesystem::remove(fifo);
  EXPECT_TRUE(has(e, fifo) && has(e, "not a regular file")) << e;
}

// A shard rewritten in place under a running job (nanoGPT's prepare.py does, np.memmap mode w+)
// is one line naming it; before, a window past a shortened end was a SIGBUS that ended the
// process. A shard renamed over or deleted is no change to the mapping: its old tokens are read.
TEST_F(TokenDataTest, AShardChangedInPlaceIsOneLineAndARenameOrDeleteIsNot) {
  namespace fs = std::filesystem;
  const std::vector<int64_t> tokens = tokensOf("train.bin");  // raw uint16: 2500 tokens, 5000 bytes
  const fs::path folder = path("changed");
  fs::create_directories(folder);
  const std::string shard = (folder / "train.bin").string();
  auto fresh = [&] {
    fs::copy_file(path("train.bin"), shard, fs::copy_options::overwrite_existing);
    return ddp::TokenData(shard, "data.train_files");
  };
  const std::vector<int64_t> starts = {100, 2400};  // the second window lies in the file's second page
  auto expectOriginal = [&](const ddp::TokenData& data) {
    const ddp::TokenBatch b = data.batch(starts, 16);
    EXPECT_EQ(rowOf(b.x, 0), slice(tokens, 100, 16));
    EXPECT_EQ(rowOf(b.y, 1), slice(tokens, 2401, 16));
  };

  // Cut to 2000 bytes in place: the window at token 2400 (byte 4800) would be past the end.
  {
    const ddp::TokenData data = fresh();
    expectOriginal(data);
    ASSERT_EQ(::truncate(shard.c_str(), 2000), 0);
    const std::string e = dataErrorOf([&] { data.batch(starts, 16); });
    EXPECT_TRUE(has(e, "token shard '" + shard + "' was changed in place while this job read it (5000 bytes when "
                       "opened, 2000 now")) << e;
    EXPECT_TRUE(has(e, "renamed over the old one")) << e;
  }
  // The same size, other tokens: the modification time tells (set a second later explicitly: a rewrite
  // within the clock's tick of the copy could keep the time, a real one comes later).
  {
    const ddp::TokenData data = fresh();
    struct stat before {};
    ASSERT_EQ(::stat(shard.c_str(), &before), 0);
    FILE* f = std::fopen(shard.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    const std::vector<unsigned char> zeros(5000, 0);
    ASSERT_EQ(std::fwrite(zeros.data(), 1, zeros.size(), f), zeros.size());
    std::fclose(f);
    const struct timespec times[2] = {before.st_atim, {before.st_mtim.tv_sec + 1, before.st_mtim.tv_nsec}};
    ASSERT_EQ(::utimensat(AT_FDCWD, shard.c_str(), times, 0), 0);
    const std::string e = dataErrorOf([&] { data.batch(starts, 16); });
    EXPECT_TRUE(has(e, "(5000 bytes when opened, 5000 now, modified since)")) << e;
  }
  // Renamed over, then deleted: the job keeps reading the file it opened.
  {
    const ddp::TokenData data = fresh();
    const std::string other = (folder / "next.bin").string();
    fs::copy_file(path("gpt2.bin"), other, fs::copy_options::overwrite_existing);
    fs::rename(other, shard);
    expectOriginal(data);
    fs::remove(shard);
    expectOriginal(data);
  }
}

TEST_F(TokenDataTest, AGlobMatchingNothingNamesThePatternAndTheSetting) {
  const std::string e = dataErrorOf([] { ddp::TokenData data(path("nothing_*.bin"), "data.val_files"); });
  EXPECT_TRUE(has(e, "data.val_files") && has(e, path("nothing_*.bin")) && has(e, "no file matches")) << e;
}

TEST_F(TokenDataTest, AGlobListsTheShardsSortedAsOneSequence) {
  const auto data = multi();
  ASSERT_EQ(data->shards().size(), 3u);
  EXPECT_EQ(data->shards()[0].path(), path("multi/shard_000.bin"));
  EXPECT_EQ(data->shards()[2].path(), path("multi/shard_002.bin"));
  EXPECT_EQ(data->totalTokens(), 1000 + 517 + 263);
  EXPECT_EQ(data->shardStart(1), 1000);
  EXPECT_EQ(data->shardStart(3), 1780);
  EXPECT_EQ(data->shardOf(999), 0u);
  EXPECT_EQ(data->shardOf(1000), 1u);
  EXPECT_EQ(data->shardOf(1779), 2u);
  const auto all = multiTokens();
  const ddp::TokenBatch b = data->batch({0, 1500, 1517 + 200}, 16);  // the last two in shards 1 and 2
  EXPECT_EQ(rowOf(b.x, 1), slice(all, 1500, 16));
  EXPECT_EQ(rowOf(b.y, 2), slice(all, 1717 + 1, 16));
  EXPECT_THROW(data->batch({1000 - 16}, 16), ddp::ConfigError);  // its 17th token is shard 1's
}

TEST_F(TokenDataTest, CheckVocabularyNamesTheFileAndTheFirstOffendingPosition) {
  const ddp::TokenData data(path("vocab.bin"), "data.train_files");
  std::string e = dataErrorOf([&] { data.checkVocabulary(100, "model.vocab_size"); });
  EXPECT_TRUE(has(e, path("vocab.bin")) && has(e, "token 150 at position 777") && has(e, "model.vocab_size 100")) << e;
  e = dataErrorOf([&] { data.checkVocabulary(151, "model.vocab_size"); });
  EXPECT_TRUE(has(e, "token 200 at position 900")) << e;
  EXPECT_NO_THROW(data.checkVocabulary(201));
  EXPECT_EQ(data.shards()[0].firstTokenAtLeast(150), 777);
  EXPECT_EQ(ddp::TokenShard(path("llama.bin")).firstTokenAtLeast(4000000000LL), 5);
  EXPECT_EQ(ddp::TokenShard(path("train.bin")).firstTokenAtLeast(65536), -1);  // uint16: nothing to scan
}

TEST_F(TokenDataTest, AShardShorterThanAWindowIsAnError) {
  auto data = std::make_shared<const ddp::TokenData>(path("tiny.bin"), "data.train_files");
  std::string e = dataErrorOf([&] { data->checkBlockSize(20, "model.block_size"); });
  EXPECT_TRUE(has(e, path("tiny.bin")) && has(e, "holds 20 tokens") && has(e, "model.block_size + 1 = 21")) << e;
  EXPECT_NO_THROW(data->checkBlockSize(19));
  e = dataErrorOf([&] { ddp::TokenSampler s(data, {1, 32}); });
  EXPECT_TRUE(has(e, path("tiny.bin")) && has(e, "fewer than the block size + 1 = 33")) << e;
  // Long enough for a window, not for a step: 2 rows of 8 + 1 tokens, 4 a step.
  e = dataErrorOf([&] { ddp::TokenSampler s(data, {4, 8, 0, 1, 0, ddp::TokenSampling::kSequential}); });
  EXPECT_TRUE(has(e, "an epoch holds 2 windows") && has(e, "= 4")) << e;
}

// nanoGPT's meta.pkl as data/shakespeare_char/prepare.py pickles it (a dict of vocab_size, itos and
// stoi), written by Python in protocol 2, its default and its highest, read without Python; a
// damaged one is one line naming the file and what is wrong.
TEST_F(TokenDataTest, ReadsNanoGptsMetaPickle) {
  const std::string script = R"(
import json, pickle, sys
d = sys.argv[1]
chars = sorted(set("Hello, w\u00f6rld! \u2603\n\t"))
meta = {"vocab_size": len(chars), "itos": {i: c for i, c in enumerate(chars)}, "stoi": {c: i for i, c in enumerate(chars)}}
for proto in (2, pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL):
    with open(f"{d}/meta{proto}.pkl", "wb") as f:
        pickle.dump(meta, f, protocol=proto)
with open(f"{d}/gap.pkl", "wb") as f:
    pickle.dump(dict(meta, itos={i: c for i, c in enumerate(chars) if i != 3}), f)
with open(f"{d}/no_vocab_size.pkl", "wb") as f:
    pickle.dump({"itos": meta["itos"]}, f)
with open(f"{d}/beyond.pkl", "wb") as f:
    pickle.dump(dict(meta, vocab_size=4), f)
with open(f"{d}/cut.pkl", "wb") as f:
    f.write(pickle.dumps(meta)[:40])
print(json.dumps({"itos": chars, "protocols": sorted({2, pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL})}))
)";
  const std::string dir = path("meta");
  std::filesystem::create_directories(dir);
  const auto run = ddp::test::runCommand({DDP_PYTHON, "-c", script, dir}, ddp::test::stdoutOnly());
  ASSERT_EQ(run.exitCode, 0) << run.output;
  const auto reply = nlohmann::json::parse(run.output);
  const auto itos = reply["itos"].get<std::vector<std::string>>();
  for (const int protocol : reply["protocols"].get<std::vector<int>>()) {
    const ddp::CharVocabulary meta = ddp::readNanoGptMeta(dir + "/meta" + std::to_string(protocol) + ".pkl");
    EXPECT_EQ(meta.vocabSize, static_cast<int64_t>(itos.size())) << protocol;
    EXPECT_EQ(meta.itos, itos) << protocol;
  }
  EXPECT_TRUE(has(dataErrorOf([&] { ddp::readNanoGptMeta(dir + "/gap.pkl"); }),
                  "'" + dir + "/gap.pkl': 'itos' has no text for token 3 (vocab_size " + std::to_string(itos.size())));
  EXPECT_TRUE(has(dataErrorOf([&] { ddp::readNanoGptMeta(dir + "/no_vocab_size.pkl"); }),
                  "'" + dir + "/no_vocab_size.pkl' has no vocab_size > 0"));
  EXPECT_TRUE(has(dataErrorOf([&] { ddp::readNanoGptMeta(dir + "/beyond.pkl"); }),
                  "'itos' has the key 4, not a token of 0 .. 3 (vocab_size 4)"));
  EXPECT_TRUE(has(dataErrorOf([&] { ddp::readNanoGptMeta(dir + "/cut.pkl"); }),
                  "'" + dir + "/cut.pkl' is corrupt: its pickle ends early"));
  std::ofstream(dir + "/text.pkl") << "not a pickle";
  EXPECT_TRUE(has(dataErrorOf([&] { ddp::readNanoGptMeta(dir + "/text.pkl"); }),
                  "'" + dir + "/text.pkl' is not a pickle of protocol 2 or later"));
  EXPECT_TRUE(has(dataErrorOf([&] { ddp::readNanoGptMeta(dir + "/none.pkl"); }), dir + "/none.pkl"));
}

TEST_F(TokenDataTest, SamplingNamesRoundTrip) {
  for (auto s : {ddp::TokenSampling::kRandom, ddp::TokenSampling::kSequential}) {
    EXPECT_EQ(ddp::parseTokenSampling(ddp::tokenSamplingName(s)), s);
  }
  EXPECT_FALSE(ddp::parseTokenSampling("sequentail").has_value());
  EXPECT_STREQ(ddp::tokenFormatName(ddp::TokenFormat::kLlmcUint32), "llmc-uint32");
}

// Sequential: the rows of the multi/ epoch, in order (row i of a shard = tokens [i·T, i·T + T + 1)).
std::vector<int64_t> epochRowStarts(const ddp::TokenData& data, int64_t t) {
  std::vector<int64_t> rows;
  for (size_t s = 0; s < data.shards().size(); ++s) {
    for (int64_t i = 0; i < (data.shards()[s].size() - 1) / t; ++i) rows.push_back(data.shardStart(s) + i * t);
  }
  return rows;
}

ddp::TokenSamplerOptions sequential(int64_t b, int64_t t, int rank, int world) {
  return {b, t, rank, world, 0, ddp::TokenSampling::kSequential};
}

TEST_F(TokenDataTest, SequentialEpochUsesEveryWindowOnceOverTwoAndThreeRanks) {
  const auto data = multi();
  const auto all = multiTokens();
  const int64_t b = 4, t = 16;
  const auto rows = epochRowStarts(*data, t);  // 62 + 32 + 16 = 110
  ASSERT_EQ(rows.size(), 110u);
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    std::multiset<int64_t> seen;
    for (int rank = 0; rank < world; ++rank) {
      ddp::TokenSampler sampler(data, sequential(b, t, rank, world));
      ASSERT_EQ(sampler.epochRows(), 110);
      ASSERT_EQ(sampler.stepsPerEpoch(), 110 / (world * b));
      for (int64_t step = 0; step < sampler.stepsPerEpoch(); ++step) {
        const auto starts = sampler.windowStarts(sampler.rowsConsumed(), sampler.globalStep());
        const ddp::TokenBatch batch = sampler.next();
        for (int64_t i = 0; i < b; ++i) {
          const int64_t row = rows[static_cast<size_t>((step * world + rank) * b + i)];  // llm.c's stride
          EXPECT_EQ(starts[static_cast<size_t>(i)], row);
          EXPECT_EQ(rowOf(batch.x, i), slice(all, row, t));
          EXPECT_EQ(rowOf(batch.y, i), slice(all, row + 1, t));
          seen.insert(starts[static_cast<size_t>(i)]);
        }
      }
      EXPECT_EQ(sampler.rowsConsumed(), sampler.stepsPerEpoch() * world * b);
      EXPECT_EQ(sampler.stepsLeftInEpoch(), 0);
    }
    // Every row once, but the tail short of a whole step (110 mod world·B of them).
    const size_t used = rows.size() - rows.size() % static_cast<size_t>(world * b);
    EXPECT_EQ(seen, std::multiset<int64_t>(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(used)));
  }
}

TEST_F(TokenDataTest, SequentialBatchesInOneShardAreLlmcsDataLoaders) {
  const auto data = std::make_shared<const ddp::TokenData>(path("gpt2.bin"), "data.train_files");
  size_t q = 0;  // the reference's "sequential" list: world 2 then 3, each rank, steps 0 and 1
  for (int world : {2, 3}) {
    for (int rank = 0; rank < world; ++rank) {
      ddp::TokenSampler sampler(data, sequential(4, 16, rank, world));
      for (int step : {0, 1}) {
        const auto& want = reply_->at("sequential").at(q++);
        const ddp::TokenBatch batch = sampler.next();
        for (int64_t i = 0; i < 4; ++i) {
          EXPECT_EQ(rowOf(batch.x, i), want["x"][i].get<std::vector<int64_t>>()) << world << " " << rank << " " << step;
          EXPECT_EQ(rowOf(batch.y, i), want["y"][i].get<std::vector<int64_t>>()) << world << " " << rank << " " << step;
        }
      }
    }
  }
  EXPECT_EQ(q, reply_->at("sequential").size());
}

// The starts all ranks of `world` take in `steps` steps from `rows` rows into epoch 0.
std::multiset<int64_t> takeSteps(const std::shared_ptr<const ddp::TokenData>& data, int world, int64_t rows,
                                 int64_t globalStep, int64_t steps) {
  std::multiset<int64_t> seen;
  for (int rank = 0; rank < world; ++rank) {
    ddp::TokenSampler sampler(data, sequential(4, 16, rank, world));
    sampler.seek(0, rows, globalStep);
    for (int64_t k = 0; k < steps; ++k) {
      const auto starts = sampler.windowStarts(sampler.rowsConsumed(), sampler.globalStep());
      seen.insert(starts.begin(), starts.end());
      sampler.next();
    }
  }
  return seen;
}

TEST_F(TokenDataTest, SequentialResumeAtAnotherWorldSizeContinuesWithTheNextUnseenWindows) {
  const auto data = multi();
  const auto rows = epochRowStarts(*data, 16);
  ddp::TokenSampler two(data, sequential(4, 16, 0, 2));
  for (int k = 0; k < 5; ++k) two.next();
  const int64_t consumed = two.rowsConsumed();  // what a checkpoint records as epochSamples
  ASSERT_EQ(consumed, 5 * 2 * 4);
  EXPECT_EQ(two.stepInEpoch(), 5);
  EXPECT_EQ(two.rowsAfter(2), consumed + 2 * 8);
  EXPECT_EQ(two.rowsAfter(1000), two.epochRows());

  // 5 steps at world 2, then the rest of the epoch at world 3: every row once, the tail excepted.
  std::multiset<int64_t> seen = takeSteps(data, 2, 0, 0, 5);
  ddp::TokenSampler three(data, sequential(4, 16, 0, 3));
  const int64_t left = three.stepsFrom(consumed);
  EXPECT_EQ(left, (110 - 40) / 12);
  const auto after = takeSteps(data, 3, consumed, 5, left);
  seen.insert(after.begin(), after.end());
  const size_t used = static_cast<size_t>(consumed + left * 12);
  EXPECT_EQ(seen, std::multiset<int64_t>(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(used)));
  EXPECT_LT(rows.size() - used, 12u);  // only a tail short of a step is dropped

  // At the same world size the resumed run is the uninterrupted one.
  ddp::TokenSampler resumed(data, sequential(4, 16, 1, 2)), straight(data, sequential(4, 16, 1, 2));
  resumed.seek(0, consumed, 5);
  for (int k = 0; k < 5; ++k) straight.next();
  EXPECT_EQ(toVector(resumed.next().x), toVector(straight.next().x));
  EXPECT_EQ(resumed.rowsConsumed(), straight.rowsConsumed());
  EXPECT_THROW(resumed.seek(0, resumed.epochRows() + 1, 0), ddp::ConfigError);
}

TEST_F(TokenDataTest, SequentialEpochsWrapAroundAsLlmcsLoader) {
  const auto data = multi();
  ddp::TokenSampler sampler(data, sequential(4, 16, 1, 3));
  const auto first = toVector(sampler.next().x);
  for (int64_t k = 1; k < sampler.stepsPerEpoch(); ++k) sampler.next();
  EXPECT_EQ(sampler.epoch(), 0);
  EXPECT_EQ(toVector(sampler.next().x), first);  // epoch 1 begins with epoch 0's first step
  EXPECT_EQ(sampler.epoch(), 1);
  EXPECT_EQ(sampler.rowsConsumed(), 12);
  EXPECT_EQ(sampler.globalStep(), sampler.stepsPerEpoch() + 1);
}

TEST_F(TokenDataTest, RandomBatchesEqualTorchRandintOfTheSameSeedRankAndStep) {
  const auto& cases = randomCases();
  const auto& want = reply_->at("random");
  ASSERT_EQ(want.size(), cases.size());
  std::map<std::string, std::shared_ptr<const ddp::TokenData>> sets = {
      {"multi", multi()}, {"gpt2", std::make_shared<const ddp::TokenData>(path("gpt2.bin"), "data.train_files")}};
  for (size_t c = 0; c < cases.size(); ++c) {
    const auto& rc = cases[c];
    SCOPED_TRACE("seed " + std::to_string(rc.seed) + " rank " + std::to_string(rc.rank) + " step " + std::to_string(rc.step));
    const auto& data = sets.at(rc.files.size() == 1 ? "gpt2" : "multi");
    // A world size that holds the rank: the draws do not depend on it.
    ddp::TokenSampler sampler(data, {rc.batch, rc.block, rc.rank, rc.rank + 1 + static_cast<int>(c % 2), rc.seed});
    EXPECT_EQ(std::to_string(ddp::TokenSampler::drawSeed(rc.seed, rc.rank, rc.step)), want[c]["draw_seed"].get<std::string>());
    EXPECT_EQ(sampler.windowStarts(0, rc.step), want[c]["starts"].get<std::vector<int64_t>>());
    sampler.seek(0, 0, rc.step);
    const ddp::TokenBatch batch = sampler.next();
    for (int64_t i = 0; i < rc.batch; ++i) {
      EXPECT_EQ(rowOf(batch.x, i), want[c]["x"][i].get<std::vector<int64_t>>());
      EXPECT_EQ(rowOf(batch.y, i), want[c]["y"][i].get<std::vector<int64_t>>());
    }
  }
}

TEST_F(TokenDataTest, RandomResumeContinuesWithTheDrawsOfTheNextStep) {
  const auto data = multi();
  ddp::TokenSamplerOptions o{4, 16, 1, 2, 1337};
  ddp::TokenSampler straight(data, o), resumed(data, o);
  EXPECT_EQ(straight.epochRows(), 1780 / 16);
  EXPECT_EQ(straight.stepsPerEpoch(), 1780 / (2 * 4 * 16));
  EXPECT_EQ(straight.validStarts(), (1000 - 16) + (517 - 16) + (263 - 16));
  for (int k = 0; k < 3; ++k) straight.next();
  resumed.seek(straight.epoch(), straight.rowsConsumed(), straight.globalStep());
  EXPECT_EQ(toVector(resumed.next().x), toVector(straight.next().x));
  // At world 3, rank 1's step 3 draws what (seed, rank 1, step 3) gives, whatever the world was.
  ddp::TokenSampler three(data, {4, 16, 1, 3, 1337});
  three.seek(0, 3 * 2 * 4, 3);
  const auto& cases = randomCases();
  const auto it = std::find_if(cases.begin(), cases.end(), [](const RandomCase& c) {
    return c.files.size() == 3 && c.seed == 1337 && c.rank == 1 && c.step == 3;
  });
  ASSERT_NE(it, cases.end());
  const auto& want = reply_->at("random").at(static_cast<size_t>(it - cases.begin()));
  EXPECT_EQ(rowOf(three.next().x, 0), want["x"][0].get<std::vector<int64_t>>());
  EXPECT_EQ(three.rowsConsumed(), 3 * 2 * 4 + 3 * 4);
  EXPECT_EQ(three.globalStep(), 4);
}

TEST_F(TokenDataTest, RandomWindowsOfACorpusShorterThanAStepOverlapAsNanoGpts) {
  // 2 ranks x 64 windows of 16 tokens: 2048 tokens a step, from 1780 (nanoGPT's get_batch draws
  // randint(len - T) starts whatever the length). The sequential order has no step to give.
  const auto data = multi();
  ddp::TokenSampler sampler(data, {64, 16, 1, 2, 5});
  EXPECT_EQ(sampler.epochRows(), 2 * 64);  // an epoch is one step
  EXPECT_EQ(sampler.stepsPerEpoch(), 1);
  sampler.next();
  sampler.next();
  EXPECT_EQ(sampler.epoch(), 1);
  EXPECT_EQ(sampler.globalStep(), 2);
  ddp::TokenSamplerOptions sequential{64, 16, 1, 2, 5};
  sequential.sampling = ddp::TokenSampling::kSequential;
  EXPECT_THROW((ddp::TokenSampler{data, sequential}), ddp::DataError);
}

TEST_F(TokenDataTest, RefusesBadOptions) {
  const auto data = multi();
  EXPECT_THROW((ddp::TokenSampler{data, {0, 16}}), ddp::ConfigError);
  EXPECT_THROW((ddp::TokenSampler{data, {4, 0}}), ddp::ConfigError);
  EXPECT_THROW((ddp::TokenSampler{data, {4, 16, 2, 2}}), ddp::ConfigError);  // rank outside the world
  EXPECT_THROW((ddp::TokenSampler{nullptr, {4, 16}}), ddp::ConfigError);
  ddp::TokenSamplerOptions unknown{4, 16};
  unknown.sampling = static_cast<ddp::TokenSampling>(7);
  EXPECT_THROW((ddp::TokenSampler{data, unknown}), ddp::ConfigError);
  ddp::TokenSampler sampler(data, {4, 16});
  EXPECT_THROW(sampler.seek(-1, 0, 0), ddp::ConfigError);
  EXPECT_THROW(data->checkVocabulary(0), ddp::ConfigError);
}

}  // namespace
