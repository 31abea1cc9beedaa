// Config parsing: defaults, overrides, and the errors users see for bad input.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/error.h"
#include "worker/config/config.h"
#include "worker/config/config_changes.h"

namespace ddp::worker {
namespace {

std::string errorOf(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parseConfig(yaml, overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Config, EmptyDocumentGivesDocumentedDefaults) {
  const WorkerConfig c = parseConfig("");
  EXPECT_EQ(c.mode, Mode::kDdp);
  EXPECT_EQ(c.backend, ddp::Backend::kAuto);
  EXPECT_EQ(c.model.name, "cnn");
  EXPECT_EQ(c.data.root, "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(c.train.batchSize, 64);
  EXPECT_DOUBLE_EQ(c.train.lr, 0.05);
  EXPECT_EQ(c.train.maxSteps, 0);
}

// An empty value is the empty string (the key's default where it has one), never the text "null"
// (issue 30, 2): `checkpoint.dir=` is <output.dir>/checkpoints, `resume=` no resume.
TEST(Config, AnEmptyValueIsTheDefaultNotTheTextNull) {
  const WorkerConfig c = parseConfig("checkpoint:\n  dir:\nresume:\n", {"checkpoint.dir=", "resume=", "data.root="});
  EXPECT_EQ(c.checkpoint.dir, "");
  EXPECT_EQ(checkpointDir(c), c.output.dir + "/checkpoints");
  EXPECT_EQ(c.resume, "");
  EXPECT_EQ(c.data.root, "");
  EXPECT_EQ(errorOf("", {"output.dir="}), "config: 'output.dir' must not be empty");
  EXPECT_NE(errorOf("train: 5"), "<no error>");
}

TEST(Config, ReadsNestedKeysAndLists) {
  const WorkerConfig c = parseConfig(R"(
mode: single
seed: 7
model: {name: mlp, hidden: [32, 16, 8]}
train: {batch_size: 5, lr: 0.25, momentum: 0.5, max_steps: 3, shuffle: false}
output: {dir: /tmp/x, export: m.pt}
)");
  EXPECT_EQ(c.mode, Mode::kSingle);
  EXPECT_EQ(c.seed, 7u);
  EXPECT_EQ(c.model.hidden, (std::vector<int64_t>{32, 16, 8}));
  EXPECT_EQ(c.train.batchSize, 5);
  EXPECT_DOUBLE_EQ(c.train.lr, 0.25);
  EXPECT_FALSE(c.train.shuffle);
  EXPECT_EQ(c.output.exportName, "m.pt");
}

TEST(Config, OverridesWinOverTheFileAndParseAsYaml) {
  const WorkerConfig c = parseConfig("train: {lr: 0.1, max_steps: 9}",
                                     {"train.lr=0.5", "train.max_steps=50", "model.hidden=[4,2]",
                                      "train.shuffle=false"});
  EXPECT_DOUBLE_EQ(c.train.lr, 0.5);
  EXPECT_EQ(c.train.maxSteps, 50);
  EXPECT_EQ(c.model.hidden, (std::vector<int64_t>{4, 2}));
  EXPECT_FALSE(c.train.shuffle);
}

// A string key takes an override's text where YAML would read something else from it: a glob
// starting with '*' (an alias to YAML), '%' (a directive), '#...' (a comment), 'a: b' (a map).
// `key=` and the null words stay the key's default; a message quoting a value is one line.
TEST(Config, AStringOverrideKeepsItsText) {
  const std::string lm = "model: {name: gpt}\ndata: {name: tokens, train_files: t.bin}\n";
  const WorkerConfig c = parseConfig(lm, {"data.train_files=*.bin", "generate.start=%", "output.dir=#out",
                                          "eval.model_path=The end: 42", "checkpoint.dir=", "resume=~",
                                          "generate.model_path='quoted'"});
  EXPECT_EQ(c.data.trainFiles, "*.bin");
  EXPECT_EQ(c.generate.start, "%");
  EXPECT_EQ(c.output.dir, "#out");
  EXPECT_EQ(c.eval.modelPath, "The end: 42");
  EXPECT_EQ(c.checkpoint.dir, "");
  EXPECT_EQ(c.resume, "");
  EXPECT_EQ(c.generate.modelPath, "quoted");  // YAML's quotes still unquote
  // A prompt's whitespace and YAML's markers, as given (YAML would trim, fold, anchor or list them).
  for (const std::string prompt : {"\tAll", "Hello\n", "trail  ", "a\n\nb", "&anc x", "- foo", "|", "  two"}) {
    EXPECT_EQ(parseConfig(lm, {"generate.start=" + prompt}).generate.start, prompt);
  }
  const std::string e = errorOf("", {"train.lr=|\n  fast\n  slow"});
  EXPECT_NE(e.find("'train.lr' (command-line override) must be a number, got 'fast\\nslow"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

// Below 1e-6 the logits divided by the temperature overflow float32 and sampling fails on NaN.
TEST(Config, GenerateTemperatureHasAFloor) {
  const std::string lm = "model: {name: gpt}\ndata: {name: tokens, train_files: t.bin}\nmode: generate\n";
  EXPECT_NE(errorOf(lm, {"generate.temperature=1e-300"})
                .find("'generate.temperature' must be a positive number, at least 1e-06"),
            std::string::npos);
  EXPECT_DOUBLE_EQ(parseConfig(lm, {"generate.temperature=1e-6"}).generate.temperature, 1e-6);
}

// data.train_file is the tensors data set's; a language model reads data.train_files (a glob):
// the single-file key is refused with the one it meant, not silently ignored.
TEST(Config, ATensorsFileKeyWithTokenDataNamesTheGlobKeys) {
  const std::string lm = "model: {name: gpt}\ndata: {name: tokens, train_files: t.bin}\n";
  for (const std::string key : {"data.train_file", "data.test_file"}) {
    const std::string e = errorOf(lm, {key + "=t.bin"});
    EXPECT_NE(e.find("'" + key + "' names a tensors file"), std::string::npos) << e;
    EXPECT_NE(e.find("data.train_files and data.val_files"), std::string::npos) << e;
  }
  EXPECT_NO_THROW(parseConfig(lm, {"data.val_files=v.bin"}));
}

// train.zero is train.sharding: zero1's alias: either one sets both; set together they must agree;
// the resolved config reads back as itself.
TEST(Config, TrainZeroIsTheAliasOfShardingZero1) {
  EXPECT_EQ(parseConfig("").train.sharding, Sharding::kNone);
  const WorkerConfig zero = parseConfig("train: {zero: true}");
  EXPECT_EQ(zero.train.sharding, Sharding::kZero1);
  const WorkerConfig zero1 = parseConfig("", {"train.sharding=zero1"});
  EXPECT_TRUE(zero1.train.zero);
  const WorkerConfig full = parseConfig("train: {sharding: full}");
  EXPECT_EQ(full.train.sharding, Sharding::kFull);
  EXPECT_FALSE(full.train.zero);
  EXPECT_EQ(parseConfig("train: {zero: true, sharding: zero1}").train.sharding, Sharding::kZero1);
  EXPECT_EQ(parseConfig("train: {zero: false, sharding: full}").train.sharding, Sharding::kFull);
  EXPECT_EQ(errorOf("train: {zero: true}", {"train.sharding=none"}),
            "config: 'train.zero' is true but 'train.sharding' is none; train.zero: true is train.sharding: zero1, "
            "set only train.sharding");
  EXPECT_NE(errorOf("train: {zero: false, sharding: zero1}"), "<no error>");
  const WorkerConfig zero2 = parseConfig("", {"train.sharding=zero2"});
  EXPECT_EQ(zero2.train.sharding, Sharding::kZero2);
  EXPECT_FALSE(zero2.train.zero);
  EXPECT_EQ(errorOf("train: {zero: true, sharding: zero2}"),
            "config: 'train.zero' is true but 'train.sharding' is zero2; train.zero: true is train.sharding: zero1, "
            "set only train.sharding");
  for (const WorkerConfig& c : {zero, zero1, zero2, full}) {
    EXPECT_EQ(dumpConfig(parseConfig(dumpConfig(c))), dumpConfig(c));
    EXPECT_EQ(parseConfig(dumpConfig(c)).train.sharding, c.train.sharding);
  }
}

TEST(Config, UnknownKeySuggestsTheNearestOne) {
  const std::string e = errorOf("trian:\n  lr: 0.1\n");
  EXPECT_NE(e.find("unknown key 'trian.lr'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'train.lr'?"), std::string::npos) << e;
  const std::string o = errorOf("", {"train.batchsize=3"});
  EXPECT_NE(o.find("unknown key 'train.batchsize'"), std::string::npos) << o;
  EXPECT_NE(o.find("'train.batch_size'"), std::string::npos) << o;
  // A key's start, its last part without its section, a tie of near misses: the key meant (the
  // fewest edits alone suggested generate.start, train.gamma, nothing and data.name).
  const std::pair<std::string, std::string> meant[] = {{"generate.temp", "generate.temperature"},
                                                       {"train.warmup", "train.warmup_steps"},
                                                       {"n_layer", "model.n_layer"},
                                                       {"data.sample", "data.sampling"},
                                                       {"chekpoint.dir", "checkpoint.dir"}};
  for (const auto& [typed, key] : meant) {
    const std::string m = errorOf("", {typed + "=1"});
    EXPECT_NE(m.find("unknown key '" + typed + "'"), std::string::npos) << m;
    EXPECT_NE(m.find("(did you mean '" + key + "'?)"), std::string::npos) << m;
  }
  EXPECT_NE(errorOf("", {"zzzzzz=1"}).find("(see docs/configuration.md)"), std::string::npos);
}

TEST(Config, WrongTypeNamesTheKeyAndTheValue) {
  const std::string e = errorOf("train:\n  lr: fast\n");
  EXPECT_NE(e.find("'train.lr'"), std::string::npos) << e;
  EXPECT_NE(e.find("must be a number"), std::string::npos) << e;
  EXPECT_NE(e.find("'fast'"), std::string::npos) << e;
  EXPECT_NE(errorOf("train: {batch_size: [1, 2]}").find("'train.batch_size'"), std::string::npos);
}

TEST(Config, OutOfRangeAndBadEnumsAreRejected) {
  EXPECT_NE(errorOf("train: {batch_size: 0}").find("'train.batch_size' must be from 1 to 2147483647"), std::string::npos);
  EXPECT_NE(errorOf("mode: fsdp").find("ddp | dp | single"), std::string::npos);
  EXPECT_NE(errorOf("backend: mpi").find("'backend'"), std::string::npos);
  EXPECT_NE(errorOf("model: {name: resnet}").find("use mlp, cnn, resnet18, resnet34, resnet50, torchscript or gpt"), std::string::npos);
  EXPECT_NE(errorOf("train: {momentum: 1.5}").find("'train.momentum'"), std::string::npos);
  EXPECT_NE(errorOf("", {"train.lr"}).find("dotted.key=value"), std::string::npos);
  EXPECT_NE(errorOf("train: [1, 2").find("YAML syntax error"), std::string::npos);
}

TEST(Config, DumpRoundTripsEveryKey) {
  const WorkerConfig a = parseConfig("mode: single\nmodel: {name: mlp, hidden: [3]}\ntrain: {lr: 0.125}");
  const WorkerConfig b = parseConfig(dumpConfig(a));
  EXPECT_EQ(dumpConfig(a), dumpConfig(b));
  EXPECT_EQ(b.mode, Mode::kSingle);
  EXPECT_DOUBLE_EQ(b.train.lr, 0.125);
  for (const auto& key : configKeys()) {
    const auto dot = key.find('.');
    const std::string top = key.substr(0, dot);
    EXPECT_NE(dumpConfig(a).find(top + ":"), std::string::npos) << key;
  }
}

// A range is checked whatever the model: a GPT key out of range is refused with an MLP too (it ran).
TEST(Config, RangesAreCheckedWhereTheKeyIsNotRead) {
  EXPECT_NE(errorOf("model: {name: mlp, n_head: 0}").find("'model.n_head' must be >= 1"), std::string::npos);
  EXPECT_NE(errorOf("data: {sampling: foo}").find("'data.sampling' is 'foo'; use random"), std::string::npos);
  EXPECT_NE(errorOf("generate: {top_k: -1}").find("'generate.top_k' must be >= 0"), std::string::npos);
}

// Modes eval and generate read a training config as it is: the keys of mode ddp's training
// (channels_last, ZeRO, hooks, join, CUDA graphs) are not refused there, as they are in dp and single.
// Every shipped config evaluates (configs/imagenet_resnet50.yaml was refused for its channels_last).
TEST(Config, ATrainingConfigEvaluatesAsItIs) {
  const std::string ddpOnly = "train: {channels_last: true, zero: true, uneven_inputs: join}\ncomm: {hook: fp16}\n";
  EXPECT_NO_THROW(parseConfig(ddpOnly + "mode: eval\neval: {model_path: m.pt}"));
  EXPECT_NO_THROW(parseConfig("train: {cuda_graph: true}\nmode: eval\neval: {model_path: m.pt}"));
  EXPECT_NE(errorOf("mode: single\ntrain: {zero: true}").find("'train.zero' shards"), std::string::npos);
  EXPECT_NE(errorOf("mode: dp\ntrain: {channels_last: true}").find("'train.channels_last' is for mode ddp and single"),
            std::string::npos);
  int configs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(DDP_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".yaml") continue;
    ++configs;
    const std::string path = entry.path().string();
    const WorkerConfig trained = loadConfig(path, {});
    EXPECT_NO_THROW(loadConfig(path, {"mode=eval", "eval.model_path=m.pt"})) << path;
    if (trained.model.name == "gpt") EXPECT_NO_THROW(loadConfig(path, {"mode=generate"})) << path;
  }
  EXPECT_GE(configs, 5);
}

// An image folder's empty data.mean / data.std resolve to the values the job uses (ImageNet's, from
// torchvision's reference recipe, with the imagenet transform; else 0 and 1), which the resolved
// config says in their shortest form and reads back as the same floats; other data sets keep [].
TEST(Config, AnImageFoldersNormalisationIsResolved) {
  const WorkerConfig imagenet = parseConfig("data: {name: image_folder, root: r, train_transform: imagenet, image_size: 224}");
  EXPECT_EQ(imagenet.data.mean, (std::vector<float>{0.485f, 0.456f, 0.406f}));
  EXPECT_EQ(imagenet.data.stddev, (std::vector<float>{0.229f, 0.224f, 0.225f}));
  const std::string dumped = dumpConfig(imagenet);
  EXPECT_NE(dumped.find("mean: [0.485, 0.456, 0.406]"), std::string::npos) << dumped;
  EXPECT_NE(dumped.find("std: [0.229, 0.224, 0.225]"), std::string::npos) << dumped;
  EXPECT_EQ(parseConfig(dumped).data.mean, imagenet.data.mean);
  const WorkerConfig plain = parseConfig("data: {name: image_folder, root: r}");
  EXPECT_EQ(plain.data.mean, (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(plain.data.stddev, (std::vector<float>{1, 1, 1}));
  const WorkerConfig given = parseConfig("data: {name: image_folder, root: r, train_transform: imagenet, image_size: 224, mean: [0.5, 0.5, 0.5]}");
  EXPECT_EQ(given.data.mean, (std::vector<float>{0.5f, 0.5f, 0.5f}));
  EXPECT_EQ(given.data.stddev, imagenet.data.stddev);
  const float third = 1.0f / 3.0f;  // 9 digits are needed to read it back
  WorkerConfig odd = given;
  odd.data.mean = {third, 0.1f, 1e-7f};
  EXPECT_EQ(parseConfig(dumpConfig(odd)).data.mean, odd.data.mean);
  EXPECT_TRUE(parseConfig("").data.mean.empty());
}

// Doubles, alone and in lists, are written in their shortest faithful form: as given where that
// reads back (0.05, 0.95), with the 16 or 17 digits a double needs otherwise (0.1 + 0.2 is not 0.3,
// and 15 digits wrote it so; resume compares the configs through this text).
TEST(Config, DoublesAreWrittenShortestAndReadBackTheSame) {
  WorkerConfig c = parseConfig("train: {lr: 0.05, betas: [0.9, 0.95]}");
  const std::string plain = dumpConfig(c);
  EXPECT_NE(plain.find("lr: 0.05\n"), std::string::npos) << plain;
  EXPECT_NE(plain.find("betas: [0.9, 0.95]"), std::string::npos) << plain;
  c.train.lr = 0.1 + 0.2;                      // 0.30000000000000004
  c.train.betas = {1.0 / 3.0, 0.1 + 0.7};      // 0.33333333333333331, 0.79999999999999993
  const WorkerConfig back = parseConfig(dumpConfig(c));
  EXPECT_EQ(back.train.lr, c.train.lr);
  EXPECT_NE(back.train.lr, 0.3);
  EXPECT_EQ(back.train.betas, c.train.betas);
}

// Issue 46 (7): an export named like one of the job's own files would be overwritten by it (or
// overwrite it); refused at start-up, naming what the name belongs to.
TEST(Config, AnExportNamedLikeTheJobsOwnFilesIsRefused) {
  const std::pair<const char*, const char*> cases[] = {
      {"summary.json", "the run's summary"},      {"metrics.jsonl", "the metrics log"},
      {"config.resolved.yaml", "the resolved config"}, {"samples_rank3.txt", "a rank's sample log"},
      {"profile_rank0.json", "a rank's profiler trace"}, {"..", "the directory above"},
      {"checkpoints", "the checkpoint directory"}};
  for (const auto& [name, what] : cases) {
    const std::string e = errorOf("", {std::string("output.export=") + name});
    EXPECT_NE(e.find(std::string("config: 'output.export' is '") + name + "', the name of " + what), std::string::npos)
        << e;
  }
  for (const char* fine : {"model.pt", "samples_rank.txt", "summary.json.pt", "metrics.pt"}) {
    EXPECT_EQ(errorOf("", {std::string("output.export=") + fine}), "<no error>") << fine;
  }
}

// A resume names what it changes of the training, not of where or how long it runs.
TEST(Config, AResumeNamesTheTrainingSettingsItChanges) {
  const std::string saved = dumpConfig(parseConfig("train: {lr: 0.1, batch_size: 32}\nmodel: {dropout: 0.0}\n"));
  const WorkerConfig now = parseConfig("train: {lr: 0.01, batch_size: 32, epochs: 9, max_steps: 100, sharding: zero1}\n"
                                       "model: {dropout: 0.2}\noutput: {dir: elsewhere}\ncheckpoint: {every_steps: 7}\n"
                                       "data: {num_workers: 3}\ncomm: {bucket_cap_mb: 5, compression: fp16}\n");
  const std::vector<ConfigChange> changes = trainingChanges(parseConfig(saved), now);
  ASSERT_EQ(changes.size(), 3u);
  EXPECT_EQ(changes[0].key, "model.dropout");
  EXPECT_EQ(changes[1].key, "train.lr");
  EXPECT_EQ(changes[1].saved, "0.1");
  EXPECT_EQ(changes[1].now, "0.01");
  EXPECT_EQ(changes[2].key, "comm.compression");
  EXPECT_EQ(describeResumeChanges(saved, now, "ck/ckpt-5.pt"),
            "resume: this run changes settings of the run that wrote the checkpoint (ck/ckpt-5.pt), the checkpoint's "
            "-> this run's: model.dropout 0 -> 0.2, train.lr 0.1 -> 0.01, comm.compression none -> fp16; training "
            "continues with this run's values (resume with the checkpoint's, in its run's config.resolved.yaml, to "
            "continue it unchanged)");
  EXPECT_EQ(describeResumeChanges(saved, parseConfig(saved), "x"), "");           // nothing changed
  EXPECT_EQ(describeResumeChanges("", now, "x"), "");                              // the file recorded none
  EXPECT_EQ(describeResumeChanges("train: {no_such_key: 1}\n", now, "x"), "");   // another version's keys
  // train.batch_size is per rank in ddp and the whole batch in dp: between the two, the line says so.
  const WorkerConfig dp = parseConfig("mode: dp\ntrain: {lr: 0.1, batch_size: 64}\nmodel: {dropout: 0.0}\n");
  EXPECT_NE(describeResumeChanges(saved, dp, "x").find("train.batch_size 32 -> 64 (per rank in the checkpoint's mode, "
                                                       "the whole batch in this mode dp)"),
            std::string::npos)
      << describeResumeChanges(saved, dp, "x");
}

// A longer run with a cosine decay to its last step (train.decay_steps 0) stretches the schedule.
TEST(Config, AResumeThatStretchesTheLearningRateDecaySaysSo) {
  const std::string saved = dumpConfig(parseConfig("train: {lr_schedule: cosine, max_steps: 20}\n"));
  const std::string line =
      "resume: the learning-rate decay (train.lr_schedule cosine, train.decay_steps 0: it ends at the run's last "
      "step) spans this run's length, which changes (train.max_steps 20 -> 40), so the learning rate jumps at the "
      "resumed step; to continue the checkpoint's schedule, set train.decay_steps to the checkpoint run's last step";
  EXPECT_EQ(describeResumeChanges(saved, parseConfig("train: {lr_schedule: cosine, max_steps: 40}\n"), "x"), line);
  // With another change: both, a line each.
  const std::string both =
      describeResumeChanges(saved, parseConfig("train: {lr_schedule: cosine, max_steps: 40, lr: 0.5}\n"), "x");
  EXPECT_NE(both.find("train.lr 0.05 -> 0.5; training continues"), std::string::npos) << both;
  EXPECT_NE(both.find("\n" + line), std::string::npos) << both;
  // decay_steps set, or a constant lr: the schedule does not depend on the run's length.
  EXPECT_EQ(describeResumeChanges(dumpConfig(parseConfig("train: {lr_schedule: cosine, max_steps: 20, decay_steps: 20}\n")),
                                  parseConfig("train: {lr_schedule: cosine, max_steps: 40, decay_steps: 20}\n"), "x"),
            "");
  EXPECT_EQ(describeResumeChanges(dumpConfig(parseConfig("train: {max_steps: 20}\n")),
                                  parseConfig("train: {max_steps: 40}\n"), "x"),
            "");
}

TEST(Config, MissingFileSaysWhatToPass) {
  try {
    loadConfig("/nonexistent/x.yaml");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/x.yaml"), std::string::npos);
  }
  // The config left out: its first override taken for the file.
  try {
    loadConfig("train.lr=0.1");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "config: the first argument is the YAML config file, but 'train.lr=0.1' looks "
                                     "like an override; put the config first: worker CONFIG.yaml train.lr=0.1");
  }
}

TEST(Config, AnOverrideWithSpacesAroundItsEqualsSignSaysSo) {
  EXPECT_EQ(errorOf("", {"train.lr", "=", "0.1"}),
            "config: override 'train.lr' is followed by '=': write each override as one argument, without spaces "
            "around '=': train.lr=VALUE");
  EXPECT_EQ(errorOf("", {"train.lr", "=0.1"}),
            "config: override 'train.lr' is followed by '=0.1': write each override as one argument, without spaces "
            "around '=': train.lr=VALUE");
  EXPECT_EQ(errorOf("", {"train.lr=", "0.1"}),
            "config: '0.1' follows the override 'train.lr=': write each override as one argument, without spaces "
            "around '=': train.lr=0.1");
  EXPECT_EQ(errorOf("", {"train.lr"}), "config: override 'train.lr' must look like dotted.key=value, e.g. train.lr=0.1");
}

}  // namespace
}  // namespace ddp::worker
