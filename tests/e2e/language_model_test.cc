// Issue 42 through the real programs: a GPT (model.name gpt) on token shards (data.name tokens) made
// by scripts/prepare_text.py from real English text (the project's own docs/, always at hand):
// the records a language model adds, DDP equal to one process on the union of the ranks' windows,
// a bitwise resume in both samplings, and bad input refused with one line, exit 2, nothing written.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/state_dict.h"
#include "tests/support/e2e_models.h"
#include "tests/support/run_command.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

// Char-level shards of docs/*.md (~150 k characters), made once per test program.
const std::string& corpus() { return test::docsCharCorpus("lm_corpus"); }

int64_t vocabulary() {
  return nlohmann::json::parse(test::readFile(corpus() + "/meta.json"))["vocab_size"].get<int64_t>();
}

// A small GPT on the corpus: 2 layers, 2 heads, 32 wide, windows of 32 tokens.
std::vector<std::string> gptJob(int nproc, const std::string& out, std::vector<std::string> extra) {
  std::vector<std::string> argv = {DDP_LAUNCH_BIN, "--nproc_per_node=" + std::to_string(nproc), DDP_WORKER_BIN,
                                   std::string(DDP_SOURCE_DIR) + "/configs/synthetic_mlp.yaml",
                                   "model.name=gpt", "model.n_layer=2", "model.n_head=2", "model.n_embd=32",
                                   "model.block_size=32", "data.name=tokens",
                                   "data.train_files=" + corpus() + "/train_*.bin",
                                   "data.val_files=" + corpus() + "/val_*.bin", "train.optimizer=adamw",
                                   "train.lr=0.003", "train.weight_decay=0.1", "train.batch_size=4",
                                   "train.log_every=5", "eval.iters=4",
                                   "output.dir=" + out};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

StateDict exported(const std::string& out) { return loadTensors(out + "/model.pt"); }


TEST(LanguageModel, TrainsAndRecordsValidationLossTokensPerSecondAndNanoGptKeys) {
  const std::string out = test::makeTempDir("lm_train");
  const auto r = test::runCommand(gptJob(2, out, {"train.max_steps=80", "eval.interval=40"}), 300);
  ASSERT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("step 40: validation loss"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" tokens/s"), std::string::npos) << r.output;
  const auto summary = nlohmann::json::parse(test::readFile(out + "/summary.json"));
  // Learning: well below the uniform guess's loss ln(vocab) after 80 steps (the corpus is docs/*.md:
  // after 20 steps a docs edit moved it over the line; here: 3.48 against 3.77).
  EXPECT_LT(summary["val_loss"].get<double>(), 0.8 * std::log(static_cast<double>(vocabulary()))) << summary.dump();
  EXPECT_GT(summary["tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(summary["val_loss_step"], 80);
  // A language model has no test set to classify: no test accuracy (it read 0 of 0).
  EXPECT_FALSE(summary.contains("test_accuracy")) << summary.dump();
  // tokens/s = windows/s × block size (all ranks).
  EXPECT_NEAR(summary["tokens_per_s"].get<double>(), 32 * summary["samples_per_s"].get<double>(), 1e-6);
  EXPECT_FALSE(summary.contains("mfu")) << "no peak FLOP/s is known for a CPU";
  std::vector<int64_t> validated;
  std::istringstream metrics(test::readFile(out + "/metrics.jsonl"));
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record.contains("val_loss")) validated.push_back(record["step"].get<int64_t>());
    if (record.contains("loss")) EXPECT_TRUE(record.contains("tokens_per_s")) << line;
  }
  EXPECT_EQ(validated, (std::vector<int64_t>{40, 80}));
  // eval.interval took the final validation at the last step: eval_seconds is its time (it was 3e-08,
  // the time to see that nothing was left to do).
  EXPECT_GT(summary["eval_seconds"].get<double>(), 1e-4) << "the final validation (step 80) took time";
  // nanoGPT's keys, the LM head tied to the token embedding.
  const StateDict state = exported(out);
  ASSERT_EQ(state.count("lm_head.weight"), 1u);
  ASSERT_EQ(state.count("transformer.wte.weight"), 1u);
  EXPECT_TRUE(state.at("lm_head.weight").equal(state.at("transformer.wte.weight")));
  EXPECT_EQ(state.at("transformer.wpe.weight").sizes(), (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(state.count("transformer.h.1.mlp.c_proj.weight"), 1u);
  // The export loads into nanoGPT's GPT (our reference after its model.py) with strict=True, and
  // its loss on the validation windows (rows 0..31 of the val shard: eval.iters 4 × 2 ranks × 4)
  // is the val_loss the job reported.
  const double reference = test::referenceGptLoss(
      out + "/model.pt", corpus() + "/val_000000.bin",
      "n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=" + std::to_string(vocabulary()), 32, 32);
  EXPECT_NEAR(reference, summary["val_loss"].get<double>(), 1e-5);
  // mode eval (nanoGPT's eval_only) on the export: one process, eval.iters 8 x 4 windows, the same
  // 32 rows: the same loss, in eval.json.
  auto eval = gptJob(1, out, {"mode=eval", "eval.model_path=" + out + "/model.pt", "eval.iters=8"});
  eval.erase(eval.begin(), eval.begin() + 2);  // the worker alone
  const auto e = test::runCommand(eval, 120);
  ASSERT_EQ(e.exitCode, 0) << e.output;
  const auto evaluated = nlohmann::json::parse(test::readFile(out + "/eval.json"));
  EXPECT_NEAR(evaluated["val_loss"].get<double>(), reference, 1e-5) << evaluated.dump();
  EXPECT_EQ(evaluated["windows_per_rank"], 32);
  fs::remove_all(out);
}

// mode generate (nanoGPT's sample.py): the prompt, then max_new_tokens characters of the data set's
// vocabulary, num_samples of them; the same seed draws the same text, another seed other text.
TEST(LanguageModel, GenerateWritesSamplesThatStartWithThePromptAndRepeatWithTheSeed) {
  const std::string out = test::makeTempDir("lm_generate");
  const auto r = test::runCommand(gptJob(1, out, {"train.max_steps=10", "eval.enabled=false", "eval.interval=4"}), 300);
  ASSERT_EQ(r.exitCode, 0) << r.output;
  // eval.enabled false: no validation after the last step, so the last one is step 8's, named so.
  EXPECT_EQ(nlohmann::json::parse(test::readFile(out + "/summary.json"))["val_loss_step"], 8);
  EXPECT_NE(r.output.find(" at step 8 (eval.enabled false: none after the last step)"), std::string::npos) << r.output;
  const auto generate = [&](const std::string& seed, const std::string& val = "") {
    auto argv = gptJob(1, out, {"mode=generate", "generate.start=The", "generate.num_samples=3",
                                "generate.max_new_tokens=40", "seed=" + seed});
    if (!val.empty()) argv.push_back("data.val_files=" + val);
    argv.erase(argv.begin(), argv.begin() + 2);  // the worker alone: one process
    const auto g = test::runCommand(argv, 120);
    EXPECT_EQ(g.exitCode, 0) << g.output;
    EXPECT_NE(g.output.find("---------------"), std::string::npos) << g.output;
    return nlohmann::json::parse(test::readFile(out + "/generated.json"))["samples"].get<std::vector<std::string>>();
  };
  const auto first = generate("5");
  ASSERT_EQ(first.size(), 3u);
  const auto itos = nlohmann::json::parse(test::readFile(corpus() + "/meta.json"))["itos"].get<std::vector<std::string>>();
  for (const auto& sample : first) {
    EXPECT_EQ(sample.rfind("The", 0), 0u) << sample;
    // 3 + 40 characters of the vocabulary (each one of its strings).
    size_t i = 3;
    int characters = 0;
    while (i < sample.size()) {
      size_t longest = 0;
      for (const auto& ch : itos) {
        if (ch.size() > longest && sample.compare(i, ch.size(), ch) == 0) longest = ch.size();
      }
      ASSERT_GT(longest, 0u) << "not of the vocabulary at byte " << i << ": " << sample;
      i += longest;
      ++characters;
    }
    EXPECT_EQ(characters, 40) << sample;
  }
  EXPECT_NE(first[0], first[1]) << "each sample draws anew";
  EXPECT_EQ(generate("5"), first);
  EXPECT_NE(generate("6"), first);
  // Sampling reads no validation data: a val glob that matches nothing is no reason to refuse.
  EXPECT_EQ(generate("5", "/nonexistent/val_*.bin"), first);
  // nanoGPT's own data folder (train.bin, val.bin, meta.pkl; no meta.json), as its prepare.py leaves
  // it, of the same text: the pickled vocabulary decodes the same samples.
  const std::string nano = out + "/nano";
  std::vector<std::string> prepare = {DDP_PYTHON, std::string(DDP_SOURCE_DIR) + "/scripts/prepare_text.py"};
  for (const auto& e : fs::directory_iterator(std::string(DDP_SOURCE_DIR) + "/docs")) {
    if (e.path().extension() == ".md") prepare.push_back(e.path().string());
  }
  std::sort(prepare.begin() + 2, prepare.end());
  prepare.insert(prepare.end(), {"--out", nano, "--level", "char", "--format", "nanogpt"});
  ASSERT_EQ(test::runCommand(prepare, 120).exitCode, 0);
  fs::remove(nano + "/meta.json");
  auto fromPickle = gptJob(1, out, {"mode=generate", "generate.start=The", "generate.num_samples=3",
                                    "generate.max_new_tokens=40", "seed=5", "data.train_files=" + nano + "/train.bin",
                                    "data.val_files="});
  fromPickle.erase(fromPickle.begin(), fromPickle.begin() + 2);
  const auto p = test::runCommand(fromPickle, 120);
  ASSERT_EQ(p.exitCode, 0) << p.output;
  EXPECT_EQ(nlohmann::json::parse(test::readFile(out + "/generated.json"))["samples"].get<std::vector<std::string>>(),
            first);
  // Data of another vocabulary (byte level, 256 tokens) than the model's: one line naming both, exit 2.
  const std::string bytes = out + "/bytes";
  fs::create_directories(bytes);
  fs::copy_file(corpus() + "/train_000000.bin", bytes + "/train_000000.bin");
  std::ofstream(bytes + "/meta.json") << R"({"level": "byte", "vocab_size": 256})";
  auto argv = gptJob(1, out, {"mode=generate", "data.train_files=" + bytes + "/train_*.bin", "data.val_files="});
  argv.erase(argv.begin(), argv.begin() + 2);
  const auto other = test::runCommand(argv, 120);
  EXPECT_EQ(other.exitCode, 2) << other.output;
  EXPECT_NE(other.output.find("is a model of " + std::to_string(vocabulary()) + " tokens"), std::string::npos)
      << other.output;
  EXPECT_NE(other.output.find("beside data.train_files has 256: the model was trained on other data"),
            std::string::npos)
      << other.output;
  // Another n_head fits every tensor of the export, a plain state dict that records no settings;
  // the resolved config its run left beside it refuses it (it sampled with 4 heads before).
  auto heads = gptJob(1, out, {"mode=generate", "generate.num_samples=1", "model.n_head=4"});
  heads.erase(heads.begin(), heads.begin() + 2);
  const auto h = test::runCommand(heads, 120);
  EXPECT_EQ(h.exitCode, 1) << h.output;
  EXPECT_NE(h.output.find("model.pt': the GPT that wrote it differs from this run's model.* (the config.resolved.yaml "
                          "of the run that wrote it vs this run's): n_head 2 vs 4"),
            std::string::npos)
      << h.output;
  // Ctrl-C while sampling: the sample being made is finished, generated.json keeps those made (the
  // first one is seed 5's first again), exit 130 as a training run stopped by it.
  auto many = gptJob(1, out, {"mode=generate", "generate.start=The", "generate.num_samples=100000",
                              "generate.max_new_tokens=40", "seed=5"});
  many.erase(many.begin(), many.begin() + 2);
  fs::remove(out + "/generated.json");
  test::Background sampling(many, out + "/sampling.log");
  ASSERT_TRUE(sampling.waitFor("---------------", 120)) << test::readFile(sampling.log);
  ASSERT_EQ(::kill(sampling.pid, SIGINT), 0);
  EXPECT_EQ(sampling.wait(120), 130) << test::readFile(sampling.log);
  const auto kept = nlohmann::json::parse(test::readFile(out + "/generated.json"));
  const auto made = kept["samples"].get<std::vector<std::string>>();
  ASSERT_FALSE(made.empty());
  EXPECT_LT(made.size(), 100000u);
  EXPECT_EQ(made.front(), first.front());
  EXPECT_EQ(kept["stopped_by_signal"], SIGINT);
  EXPECT_NE(test::readFile(sampling.log).find("after " + std::to_string(made.size()) + " of 100000 samples"),
            std::string::npos) << test::readFile(sampling.log);
  fs::remove_all(out);
}

// llm.c's order: rank r takes the B windows at r·B of each step's 2B, so two ranks of B windows see
// what one process of 2B sees; the averaged gradients and so the AdamW steps are the same. With
// train.zero too: the ranks' AdamW state sharded, nanoGPT's two groups (decay on >= 2-D only) each
// partitioned.
void expectTwoRanksEqualOneProcess(const std::vector<std::string>& twoRankSettings) {
  const std::string two = test::makeTempDir("lm_two");
  const std::string one = test::makeTempDir("lm_one");
  const std::vector<std::string> common = {"data.sampling=sequential", "train.max_steps=6", "eval.enabled=false"};
  auto a = common;
  a.push_back("train.batch_size=4");
  a.insert(a.end(), twoRankSettings.begin(), twoRankSettings.end());
  auto b = common;
  b.push_back("train.batch_size=8");
  const auto r2 = test::runCommand(gptJob(2, two, a), 300);
  ASSERT_EQ(r2.exitCode, 0) << r2.output;
  const auto r1 = test::runCommand(gptJob(1, one, b), 300);
  ASSERT_EQ(r1.exitCode, 0) << r1.output;
  EXPECT_LE(test::maxStateDifference(exported(two), exported(one)), 1e-5);
  fs::remove_all(two);
  fs::remove_all(one);
}

TEST(LanguageModel, TwoRanksEqualOneProcessOnTheUnionOfTheirWindows) { expectTwoRanksEqualOneProcess({}); }
TEST(LanguageModel, TwoRanksWithShardedAdamWStateEqualOneProcess) {
  expectTwoRanksEqualOneProcess({"train.zero=true"});
}

// train.activation_checkpointing: each block recomputed in backward under the forward's random
// state, so with dropout too the model is the one trained without it, to the bit; fully sharded too.
TEST(LanguageModel, ActivationCheckpointingTrainsTheSameModelToTheBit) {
  for (const std::string sharding : {"none", "full"}) {
    const std::string plain = test::makeTempDir("lm_plain");
    const std::string checkpointed = test::makeTempDir("lm_recompute");
    const std::vector<std::string> common = {"model.dropout=0.1", "train.max_steps=4", "eval.enabled=false",
                                             "train.sharding=" + sharding};
    const auto r1 = test::runCommand(gptJob(2, plain, common), 300);
    ASSERT_EQ(r1.exitCode, 0) << r1.output;
    auto on = common;
    on.push_back("train.activation_checkpointing=true");
    const auto r2 = test::runCommand(gptJob(2, checkpointed, on), 300);
    ASSERT_EQ(r2.exitCode, 0) << r2.output;
    EXPECT_NE(r2.output.find("the 2 units of model 'gpt' recompute their activations"), std::string::npos) << r2.output;
    EXPECT_EQ(test::maxStateDifference(exported(checkpointed), exported(plain)), 0.0) << sharding;
    fs::remove_all(plain);
    fs::remove_all(checkpointed);
  }
}

// `straight` trains 8 steps at once, `split` the first 4 (with checkpoint.every_steps=4 in
// `common`, a checkpoint at step 4).
void trainWholeAndFirstHalf(const std::string& straight, const std::string& split,
                            const std::vector<std::string>& common) {
  auto all = common;
  all.push_back("train.max_steps=8");
  const auto r = test::runCommand(gptJob(2, straight, all), 300);
  ASSERT_EQ(r.exitCode, 0) << r.output;
  auto first = common;
  first.push_back("train.max_steps=4");
  const auto r1 = test::runCommand(gptJob(2, split, first), 300);
  ASSERT_EQ(r1.exitCode, 0) << r1.output;
}

// 8 steps at once equal 4, a checkpoint, and 4 more after resume=auto, bit for bit; `inspect` sees
// the resumed run's output directory before it is removed.
void expectBitwiseResume(const std::string& sampling, const std::vector<std::string>& settings = {},
                         const std::function<void(const std::string&)>& inspect = {}) {
  const std::string straight = test::makeTempDir("lm_straight");
  const std::string split = test::makeTempDir("lm_split");
  std::vector<std::string> common = {"data.sampling=" + sampling, "eval.enabled=false", "checkpoint.every_steps=4"};
  common.insert(common.end(), settings.begin(), settings.end());
  ASSERT_NO_FATAL_FAILURE(trainWholeAndFirstHalf(straight, split, common));
  auto second = common;
  second.push_back("train.max_steps=8");
  second.push_back("resume=auto");
  const auto r2 = test::runCommand(gptJob(2, split, second), 300);
  ASSERT_EQ(r2.exitCode, 0) << r2.output;
  EXPECT_EQ(test::maxStateDifference(exported(straight), exported(split)), 0.0) << sampling;
  if (inspect) inspect(split);
  fs::remove_all(straight);
  fs::remove_all(split);
}

TEST(LanguageModel, ResumeIsBitwiseWithRandomWindows) { expectBitwiseResume("random"); }
TEST(LanguageModel, ResumeIsBitwiseWithSequentialWindows) { expectBitwiseResume("sequential"); }
TEST(LanguageModel, ResumeIsBitwiseWithShardedAdamWState) { expectBitwiseResume("sequential", {"train.zero=true"}); }
TEST(LanguageModel, ResumeIsBitwiseFullySharded) { expectBitwiseResume("sequential", {"train.sharding=full"}); }
// Two micro-batches a step: the checkpoints record the run's micro-batches (2 × the steps), the key
// of the random draws a resume with fewer a step goes on from (train_order_test has that resume).
TEST(LanguageModel, ResumeIsBitwiseWithAccumulationAndRecordsTheMicroBatches) {
  expectBitwiseResume("random", {"train.accumulate_steps=2"}, [](const std::string& out) {
    const std::string script =
        "import sys, torch\n"
        "for path in sys.argv[1:]:\n"
        "    p = torch.load(path)['progress']\n"
        "    print(p['global_step'], p['micro_steps'])\n";
    const auto r = test::runCommand({DDP_PYTHON, "-c", script, out + "/checkpoints/ckpt-00000004.pt",
                                     out + "/checkpoints/ckpt-00000008.pt"},
                                    120);
    EXPECT_EQ(r.exitCode, 0) << r.output;
    EXPECT_EQ(r.output, "4 8\n8 16\n");
  });
}
TEST(LanguageModel, ResumeIsBitwiseWithZeroTwo) { expectBitwiseResume("random", {"train.sharding=zero2"}); }

// A fully sharded run's checkpoint (a directory of each rank's rows, ddp::Checkpointer) resumes a
// DDP run on the same windows, which ends where the sharded run does within float rounding, and
// a sharded run of 3 ranks (resharded, continuing with the next windows).
TEST(LanguageModel, ShardedCheckpointResumesDdpAndAnotherWorldSize) {
  const std::string straight = test::makeTempDir("lm_full_straight");
  const std::string split = test::makeTempDir("lm_full_split");
  const std::vector<std::string> common = {"data.sampling=sequential", "eval.enabled=false",
                                           "checkpoint.every_steps=4", "train.sharding=full"};
  ASSERT_NO_FATAL_FAILURE(trainWholeAndFirstHalf(straight, split, common));
  const std::string saved = split + "/checkpoints/ckpt-00000004";
  ASSERT_TRUE(fs::exists(saved + "/manifest.json"));
  ASSERT_TRUE(fs::exists(saved + "/rank-00001.pt"));
  const auto asDdp = test::runCommand(
      gptJob(2, split, {"data.sampling=sequential", "eval.enabled=false", "train.max_steps=8", "resume=" + saved,
                        "train.sharding=none"}),
      300);
  ASSERT_EQ(asDdp.exitCode, 0) << asDdp.output;
  EXPECT_NE(asDdp.output.find("resumed from " + saved), std::string::npos) << asDdp.output;
  EXPECT_LE(test::maxStateDifference(exported(straight), exported(split)), 1e-5);
  const auto three = test::runCommand(
      gptJob(3, split, {"data.sampling=sequential", "eval.enabled=false", "train.max_steps=8", "resume=" + saved,
                        "train.sharding=full"}),
      300);
  ASSERT_EQ(three.exitCode, 0) << three.output;
  EXPECT_NE(three.output.find("was written by 2 ranks, this job has 3"), std::string::npos) << three.output;
  // Another n_head fits every tensor's shape; the checkpoint's recorded config refuses it.
  const auto heads = test::runCommand(
      gptJob(2, split, {"data.sampling=sequential", "eval.enabled=false", "train.max_steps=8", "resume=" + saved,
                        "model.n_head=4"}),
      300);
  EXPECT_EQ(heads.exitCode, 2) << heads.output;  // this run's config to mend: no restart into it
  EXPECT_NE(heads.output.find("'" + saved + "': the GPT that wrote it differs from this run's model.* (its run's "
                              "config vs this run's): n_head 2 vs 4"), std::string::npos) << heads.output;
  // Refused before anything was loaded: no "resumed from" line above the refusal.
  EXPECT_EQ(heads.output.find("resumed from"), std::string::npos) << heads.output;
  fs::remove_all(straight);
  fs::remove_all(split);
}

// Splits shorter than one step's windows (2 ranks x 4 windows of 32 + 1 tokens): nanoGPT's
// get_batch and estimate_loss draw overlapping random windows from any split of block_size + 1
// tokens or more, so data.sampling=random trains on them, and the validation loss takes random
// windows too, the same at every evaluation: those torch.randint draws from (seed, rank, iteration).
TEST(LanguageModel, SplitsShorterThanAStepAreSampledAsNanoGptSamplesThem) {
  const std::string out = test::makeTempDir("lm_short_splits");
  const std::string tiny = out + "/tiny";
  fs::create_directories(tiny);
  const auto cut = [&](const std::string& from, const std::string& to, int32_t tokens) {
    std::string shard = test::readFile(from);
    ASSERT_GE(shard.size(), 1024u + 2u * static_cast<size_t>(tokens));
    std::memcpy(&shard[8], &tokens, sizeof tokens);  // llm.c's header[2]: the token count
    std::ofstream(to, std::ios::binary) << shard.substr(0, 1024 + 2 * static_cast<size_t>(tokens));
  };
  cut(corpus() + "/train_000000.bin", tiny + "/train_000000.bin", 200);  // 6 windows of 32
  cut(corpus() + "/val_000000.bin", tiny + "/val_000000.bin", 80);       // 2 windows of 32
  fs::copy_file(corpus() + "/meta.json", tiny + "/meta.json");
  const std::vector<std::string> tinyData = {"data.train_files=" + tiny + "/train_*.bin",
                                             "data.val_files=" + tiny + "/val_*.bin", "data.sampling=random"};
  auto train = tinyData;
  train.insert(train.end(), {"train.max_steps=3", "eval.interval=3"});
  const auto r = test::runCommand(gptJob(2, out, train), 300);
  ASSERT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("data.val_files holds 2 window(s) of model.block_size + 1 tokens, fewer than the 8 one "
                          "evaluation batch takes"), std::string::npos) << r.output;
  const auto summary = nlohmann::json::parse(test::readFile(out + "/summary.json"));
  EXPECT_TRUE(std::isfinite(summary["val_loss"].get<double>()));
  // The final validation taken after the last step (step 1, not one of eval.interval's): its time.
  EXPECT_EQ(summary["val_loss_step"], 1);
  EXPECT_GT(summary["eval_seconds"].get<double>(), 1e-4);
  // mode eval on the export, one rank, seed 11: eval.iters 3 batches of 4 random windows of the
  // 80 tokens, against the reference's loss on the windows torch.randint draws.
  auto eval = gptJob(1, out, tinyData);
  eval.insert(eval.end(), {"mode=eval", "eval.model_path=" + out + "/model.pt", "eval.iters=3", "seed=11"});
  eval.erase(eval.begin(), eval.begin() + 2);  // the worker alone
  const auto e = test::runCommand(eval, 120);
  ASSERT_EQ(e.exitCode, 0) << e.output;
  const std::string script =
      "import array, json, sys, torch\n"
      "sys.path.insert(0, '" + std::string(DDP_SOURCE_DIR) + "/tests/python')\n"
      "from gpt_reference import Gpt\n"
      "from token_reference import draw_seed\n"
      "m = Gpt(dict(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=" + std::to_string(vocabulary()) +
      ", dropout=0.0, bias=True))\n"
      "m.load_state_dict(torch.load('" + out + "/model.pt', map_location='cpu'), strict=True); m.eval()\n"
      "a = array.array('H'); a.frombytes(open('" + tiny + "/val_000000.bin', 'rb').read()[1024:])\n"
      "t = torch.tensor(a, dtype=torch.int64)\n"
      "losses = []\n"
      "for k in range(3):\n"
      "    ix = torch.randint(len(t) - 32, (4,), generator=torch.Generator().manual_seed(draw_seed(11, 0, k)))\n"
      "    w = torch.stack([t[i:i + 33] for i in ix.tolist()])\n"
      "    with torch.no_grad(): losses.append(m(w[:, :-1], w[:, 1:])[1].item())\n"
      "print(json.dumps({'loss': sum(losses) / 3}))\n";
  const auto py = test::runCommand({DDP_PYTHON, "-c", script}, test::stdoutOnly());
  ASSERT_EQ(py.exitCode, 0) << py.output;
  EXPECT_NEAR(nlohmann::json::parse(test::readFile(out + "/eval.json"))["val_loss"].get<double>(),
              nlohmann::json::parse(py.output)["loss"].get<double>(), 1e-5);
  fs::remove_all(out);
}

// Before any training there is no model to sample: one line that says to train first, exit 2.
TEST(LanguageModel, GenerateWithoutATrainedModelSaysToTrainFirst) {
  const std::string out = test::makeTempDir("lm_generate_none");
  auto argv = gptJob(1, out + "/out", {"mode=generate"});
  argv.erase(argv.begin(), argv.begin() + 2);
  const auto g = test::runCommand(argv, 60);
  EXPECT_EQ(g.exitCode, 2) << g.output;
  EXPECT_NE(g.output.find("mode generate samples from a trained model, but '" + out + "/out/model.pt' does not exist "
                          "(output.dir/model.pt); train first"), std::string::npos) << g.output;
  EXPECT_FALSE(fs::exists(out + "/out/generated.json"));
  fs::remove_all(out);
}

// A prompt the model cannot take is one line, exit 2, before any model file is read: a character
// whose token is past the model's vocabulary (a byte-level model.vocab_size of 128 and a non-ASCII
// prompt would index past the embedding), or FILE: naming a named pipe (it would wait for a writer)
// or a folder.
TEST(LanguageModel, GenerateRefusesAPromptTheModelCannotTake) {
  const std::string out = test::makeTempDir("lm_generate_prompt");
  const std::string fifo = out + "/prompt.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::ofstream(out + "/never_read.pt") << "not a model: read, it would fail otherwise";  // there, as a start-up check asks
  for (const auto& [start, expected] : std::vector<std::pair<std::string, std::string>>{
           {"zz", "but the model's vocabulary has 2 tokens (model.vocab_size)"},
           {"FILE:" + fifo, "which is not a file (a folder, a named pipe or a device)"},
           {"FILE:" + out, "which is not a file (a folder, a named pipe or a device)"}}) {
    SCOPED_TRACE(start);
    auto argv = gptJob(1, out, {"mode=generate", "generate.start=" + start, "model.vocab_size=2",
                                "generate.model_path=" + out + "/never_read.pt"});
    argv.erase(argv.begin(), argv.begin() + 2);  // the worker alone: one process
    const auto g = test::runCommand(argv, 60);
    EXPECT_EQ(g.exitCode, 2) << g.output;
    EXPECT_NE(g.output.find(expected), std::string::npos) << g.output;
  }
  fs::remove_all(out);
}

struct BadLm {
  std::string name;
  std::vector<std::string> extra;  // after gptJob's arguments
  std::string expected;
};

std::ostream& operator<<(std::ostream& out, const BadLm& c) { return out << c.name; }

// Token files that are wrong in one way each, beside the good corpus.
std::string badShard(const std::string& kind) {
  static std::vector<std::string> made;  // removed when the program exits
  if (made.empty()) std::atexit([] { for (const auto& d : made) fs::remove_all(d); });
  const std::string dir = test::makeTempDir("lm_bad");
  made.push_back(dir);
  if (kind == "nanogpt") {  // nanoGPT's layout (raw uint16 train.bin, meta.pkl, no meta.json); a damaged meta.pkl
    std::vector<uint16_t> tokens(1000, 1);
    std::ofstream(dir + "/train.bin", std::ios::binary).write(reinterpret_cast<const char*>(tokens.data()), 2000);
    std::ofstream(dir + "/meta.pkl") << "not a pickle";
    return dir + "/train.bin";
  }
  if (kind == "othervocab") {  // a good shard of another prepared data set (30 characters)
    nlohmann::json meta = {{"level", "char"}, {"vocab_size", 30}, {"format", "llmc"}, {"itos", nlohmann::json::array()}};
    for (int i = 0; i < 30; ++i) meta["itos"].push_back(std::string(1, static_cast<char>('a' + i % 26)) + (i < 26 ? "" : "'"));
    std::ofstream(dir + "/meta.json") << meta.dump();
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520;
    header[1] = 1;
    header[2] = 500;
    std::ofstream shard(dir + "/val_000000.bin", std::ios::binary);
    shard.write(reinterpret_cast<const char*>(header.data()), 1024);
    std::vector<uint16_t> tokens(500, 1);
    shard.write(reinterpret_cast<const char*>(tokens.data()), 1000);
    return dir + "/val_*.bin";
  }
  const std::string path = dir + "/train_000000.bin";
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = kind == "version" ? 3 : 1;
  header[2] = kind == "count" ? 100 : 10;
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  std::vector<uint16_t> tokens(10, 1);
  out.write(reinterpret_cast<const char*>(tokens.data()), 20);
  return dir + "/train_*.bin";
}

class BadLanguageModelInput : public ::testing::TestWithParam<BadLm> {};

TEST_P(BadLanguageModelInput, OneLineExitTwoNothingWritten) {
  const BadLm c = GetParam();
  const std::string out = test::makeTempDir("lm_bad_out");
  const auto r = test::runCommand(gptJob(2, out + "/out", c.extra), 120);
  EXPECT_EQ(r.exitCode, 2) << r.output;
  EXPECT_NE(r.output.find(c.expected), std::string::npos) << "expected '" << c.expected << "' in:\n" << r.output;
  EXPECT_EQ(r.output.find("Exception raised from"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out + "/out/model.pt"));
  EXPECT_FALSE(fs::exists(out + "/out/summary.json"));
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(
    Table, BadLanguageModelInput,
    ::testing::Values(
        BadLm{"GptOnImages", {"data.name=synthetic"}, "model.name' is gpt, a language model, but data.name is synthetic"},
        BadLm{"ImageModelOnTokens", {"model.name=mlp"}, "data.name' is tokens (a language corpus) but model.name is mlp"},
        BadLm{"HeadsDoNotDivideWidth", {"model.n_head=3"}, "model.n_embd' (32) must be a positive multiple of model.n_head (3)"},
        BadLm{"TokenBeyondTheVocabulary", {"model.vocab_size=20"}, "model.vocab_size"},
        BadLm{"ShardShorterThanAWindow", {"model.block_size=100000"}, "model.block_size"},
        BadLm{"WrongVersion", {"data.train_files=" + badShard("version")}, "version"},
        BadLm{"CountDisagreesWithSize", {"data.train_files=" + badShard("count")}, "100"},
        BadLm{"NoShardMatches", {"data.train_files=/nonexistent/train_*.bin"}, "data.train_files"},
        BadLm{"DamagedNanoGptMetaPickle", {"data.train_files=" + badShard("nanogpt")},
              "/meta.pkl' is not a pickle of protocol 2 or later"},
        BadLm{"ShardsOfTwoVocabularies", {"data.val_files=" + badShard("othervocab")},
              "data: the shards come from data sets of different vocabularies: "},
        BadLm{"GenerateWithAnImageModel", {"model.name=cnn", "data.name=fashion-mnist", "mode=generate"},
              "'mode' is generate, which writes text with a language model"}),
    [](const ::testing::TestParamInfo<BadLm>& info) { return info.param.name; });

}  // namespace
}  // namespace ddp
