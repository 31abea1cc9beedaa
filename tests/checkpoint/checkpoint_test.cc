// Loading state_dicts users bring, and the training checkpoint's integrity.
#include <gtest/gtest.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scalar_tensor.h>
#include <caffe2/serialize/inline_container.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <fstream>
#include <optional>

#include "common/error.h"
#include "ddp/checkpoint.h"
#include "ddp/files.h"
#include "ddp/process_group.h"
#include "ddp/state_dict.h"
#include "libddp/checkpoint/checkpoint_dir.h"
#include "libddp/checkpoint/state_dict_loader.h"
#include "libddp/checkpoint/training_checkpoint.h"
#include "worker/models/models.h"
#include "tests/support/run_command.h"

namespace ddp::checkpoint {
namespace {

namespace fs = std::filesystem;

class Checkpoint : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmpl = (fs::temp_directory_path() / "ddp_ckpt_XXXXXX").string();
    dir_ = ::mkdtemp(tmpl.data());
    manifest_ = nlohmann::json::parse(
        test::runCommand({DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/make_torch_files.py", dir_}, test::stdoutOnly())
            .output);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static inline std::string dir_;
  static inline nlohmann::json manifest_;
};

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST_F(Checkpoint, GpuDataParallelStateDictFromPythonLoadsIntoThePlainModel) {
  worker::Mlp mlp(worker::InputSpec{1, 28, 28, 10}, std::vector<int64_t>{16});
  loadModelFile(*mlp, dir_ + "/gpu_dp_mlp.pt");
  const auto& expected = manifest_["gpu_dp_mlp.pt"];
  for (const auto& item : mlp->named_parameters()) {
    const auto& e = expected.at("module." + item.key());
    const auto values = e["values"].get<std::vector<double>>();
    const at::Tensor flat = item.value().to(at::kDouble).flatten();
    ASSERT_EQ(flat.numel(), static_cast<int64_t>(values.size())) << item.key();
    for (size_t i = 0; i < values.size(); i += 97) EXPECT_EQ(flat[i].item<double>(), values[i]) << item.key();
  }
}

TEST_F(Checkpoint, AMismatchListsMissingUnexpectedAndShapes) {
  worker::Mlp wider(worker::InputSpec{1, 28, 28, 10}, std::vector<int64_t>{32});
  const at::Tensor before = wider->named_parameters()["fc2.bias"].clone();  // fc2.bias [10] fits
  const std::string shapes = errorOf([&] { loadModelFile(*wider, dir_ + "/gpu_dp_mlp.pt"); });
  EXPECT_NE(shapes.find("gpu_dp_mlp.pt' does not fit"), std::string::npos) << shapes;
  EXPECT_NE(shapes.find("fc1.weight [16, 784] in the file vs [32, 784] in the model"), std::string::npos) << shapes;

  worker::Mlp deeper(worker::InputSpec{1, 28, 28, 10}, std::vector<int64_t>{16, 8});
  const std::string keys = errorOf([&] { loadModelFile(*deeper, dir_ + "/gpu_dp_mlp.pt"); });
  EXPECT_NE(keys.find("missing keys: fc3.bias, fc3.weight"), std::string::npos) << keys;

  worker::Cnn cnn(worker::InputSpec{1, 28, 28, 10});
  const std::string other = errorOf([&] { loadModelFile(*cnn, dir_ + "/gpu_dp_mlp.pt"); });
  EXPECT_NE(other.find("missing keys: conv1.bias"), std::string::npos) << other;
  EXPECT_NE(other.find("shape differences: fc1.bias [16] in the file vs [128] in the model"), std::string::npos) << other;

  worker::Mlp shallow(worker::InputSpec{1, 28, 28, 10}, std::vector<int64_t>{});
  const std::string extra = errorOf([&] { loadModelFile(*shallow, dir_ + "/gpu_dp_mlp.pt"); });
  EXPECT_NE(extra.find("unexpected keys: fc2.bias, fc2.weight"), std::string::npos) << extra;
  // Not one key in common: another model, said in a line of a few keys, not lists of every one.
  torch::nn::Linear linear(784, 10);
  const std::string another = errorOf([&] { loadModelFile(*linear, dir_ + "/gpu_dp_mlp.pt"); });
  EXPECT_NE(another.find("gpu_dp_mlp.pt' holds another model: none of its 4 keys (fc1.bias, fc1.weight, fc2.bias, "
                         "... (1 more)) is one of the configured model's 2 (bias, weight); check that the model"),
            std::string::npos)
      << another;
  // A failed load changes nothing, not even the entries that would fit.
  EXPECT_TRUE(at::equal(before, wider->named_parameters()["fc2.bias"]));
}

TEST_F(Checkpoint, PrefixesAreStripped) {
  EXPECT_EQ(stripWrapperPrefix("module.fc1.weight"), "fc1.weight");
  EXPECT_EQ(stripWrapperPrefix("module.module.fc1.weight"), "fc1.weight");
  EXPECT_EQ(stripWrapperPrefix("_orig_mod.conv1.bias"), "conv1.bias");
  EXPECT_EQ(stripWrapperPrefix("fc1.module.weight"), "fc1.module.weight");
}

TrainingState sampleState() {
  TrainingState s;
  s.model = {{"fc1.weight", at::randn({4, 3})}, {"fc1.bias", at::arange(4).to(at::kFloat)}};
  s.optimizer = {{"momentum_buffer.fc1.weight", at::randn({4, 3})}};
  s.epoch = 2;
  s.stepInEpoch = 5;
  s.globalStep = 17;
  s.samples = 17 * 64;
  s.worldSize = 2;
  s.seed = 42;
  s.cpuRng = at::arange(16).to(at::kByte);
  s.config = "mode: ddp\n";
  return s;
}

// sampleState() as a run with gradient accumulation records it: 4 micro-batches a step, and 20 of
// the epoch's windows consumed.
TrainingState accumulatingState() {
  TrainingState s = sampleState();
  s.epochSamples = 20;
  s.microSteps = 17 * 4;
  return s;
}

TEST_F(Checkpoint, TrainingCheckpointRoundTripsExactly) {
  const TrainingState s = sampleState();
  const std::string path = dir_ + "/roundtrip.pt";
  saveTrainingCheckpoint(s, path);
  const TrainingState r = loadTrainingCheckpoint(path);
  ASSERT_EQ(r.model.size(), 2u);
  for (size_t i = 0; i < s.model.size(); ++i) {
    EXPECT_EQ(r.model[i].first, s.model[i].first);
    EXPECT_TRUE(at::equal(r.model[i].second, s.model[i].second));
  }
  EXPECT_TRUE(at::equal(r.optimizer[0].second, s.optimizer[0].second));
  EXPECT_EQ(r.epoch, 2);
  EXPECT_EQ(r.stepInEpoch, 5);
  EXPECT_EQ(r.globalStep, 17);
  EXPECT_EQ(r.samples, 17 * 64);
  EXPECT_EQ(r.worldSize, 2);
  EXPECT_EQ(r.seed, 42);
  EXPECT_TRUE(at::equal(r.cpuRng, s.cpuRng));
  EXPECT_EQ(r.config, s.config);
  EXPECT_FALSE(r.epochSamples.has_value());  // not recorded: absent, not 0
  EXPECT_FALSE(r.microSteps.has_value());
  EXPECT_EQ(checksumOf(r), checksumOf(s));
  const std::string accumulating = dir_ + "/accumulating.pt";
  const TrainingState saved = accumulatingState();
  saveTrainingCheckpoint(saved, accumulating);
  const TrainingState a = loadTrainingCheckpoint(accumulating);
  EXPECT_EQ(a.epochSamples, std::optional<int64_t>(20));
  EXPECT_EQ(a.microSteps, std::optional<int64_t>(68));
  EXPECT_EQ(checksumOf(a), checksumOf(saved));
  // A model file reader gets the model and the recorded config (no model_args: not nanoGPT's).
  const ddp::ModelFile file = ddp::readModelFile(path);
  EXPECT_EQ(file.config, s.config);
  EXPECT_TRUE(file.modelArgs.empty());
  ASSERT_EQ(file.state.size(), 2u);
  EXPECT_TRUE(at::equal(file.state.at(s.model[0].first), s.model[0].second));
}

// {"__dict__": [[k, v], ...]} (read_torch_file.py's JSON for a dict) → {k: v}.
nlohmann::json pyDictOf(const nlohmann::json& dict) {
  nlohmann::json out = nlohmann::json::object();
  if (!dict.contains("__dict__")) {
    ADD_FAILURE() << "not a dict: " << dict.dump().substr(0, 200);
    return out;
  }
  for (const auto& kv : dict["__dict__"]) out[kv[0].get<std::string>()] = kv[1];
  return out;
}

void expectTensorIs(const nlohmann::json& py, const at::Tensor& t, const std::string& name) {
  EXPECT_EQ(py["shape"].get<std::vector<int64_t>>(), t.sizes().vec()) << name;
  const at::Tensor flat = t.to(at::kDouble).flatten().contiguous();
  const auto values = py["values"].get<std::vector<double>>();
  ASSERT_EQ(static_cast<int64_t>(values.size()), flat.numel()) << name;
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(values[i], flat[i].item<double>()) << name << "[" << i << "]";
}

TEST_F(Checkpoint, PythonsPlainTorchLoadReadsEverySection) {
  TrainingState s = sampleState();
  s.cudaRng = {at::arange(8).to(at::kByte)};
  const std::string path = dir_ + "/python.pt";
  saveTrainingCheckpoint(s, path);
  // read_torch_file.py: torch.load(path) without weights_only on PyTorch >= 2.6 (it asserts the version).
  const std::string out =
      test::runCommand({DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/read_torch_file.py", path}, test::CommandOptions())
          .output;
  nlohmann::json py;
  ASSERT_NO_THROW(py = nlohmann::json::parse(out)) << out;
  const nlohmann::json c = pyDictOf(py);
  std::vector<std::string> sections;
  for (const auto& kv : py["__dict__"]) sections.push_back(kv[0]);
  EXPECT_EQ(sections, (std::vector<std::string>{"format", "model", "optimizer", "progress", "rng", "config", "checksum"}));
  EXPECT_EQ(c["format"], kCheckpointFormat);
  const nlohmann::json model = pyDictOf(c["model"]);
  ASSERT_EQ(model.size(), s.model.size());
  for (const auto& [name, t] : s.model) expectTensorIs(model[name], t, name);
  const nlohmann::json optimizer = pyDictOf(c["optimizer"]);
  ASSERT_EQ(optimizer.size(), s.optimizer.size());
  for (const auto& [name, t] : s.optimizer) expectTensorIs(optimizer[name], t, name);
  const nlohmann::json progress = pyDictOf(c["progress"]);
  EXPECT_EQ(progress, (nlohmann::json{{"epoch", 2}, {"step_in_epoch", 5}, {"global_step", 17}, {"samples", 17 * 64},
                                      {"world_size", 2}, {"seed", 42}}));
  // The positions a run with gradient accumulation adds, under their own names.
  const std::string accumulating = dir_ + "/python_accumulating.pt";
  saveTrainingCheckpoint(accumulatingState(), accumulating);
  const std::string added = test::runCommand({DDP_PYTHON, "-c",
                                              "import sys, torch; p = torch.load(sys.argv[1])['progress']; "
                                              "print(p['epoch_samples'], p['micro_steps'])",
                                              accumulating},
                                             test::CommandOptions())
                                .output;
  EXPECT_EQ(added, "20 68\n");
  const nlohmann::json rng = pyDictOf(c["rng"]);
  EXPECT_EQ(rng["cpu"]["dtype"], "uint8");
  expectTensorIs(rng["cpu"], s.cpuRng, "rng.cpu");
  expectTensorIs(rng["cuda0"], s.cudaRng[0], "rng.cuda0");
  EXPECT_EQ(c["config"], s.config);
  char crc[16];
  std::snprintf(crc, sizeof crc, "%08x", checksumOf(s));
  EXPECT_EQ(c["checksum"], std::string("crc32:") + crc);
}

// An fp16 run's checkpoint: Python's GradScaler.load_state_dict takes its "scaler" section as it is,
// and Adam's moments sit under the names Python's Adam state uses, by parameter.
TEST_F(Checkpoint, PythonsGradScalerLoadsTheScalerSection) {
  TrainingState s = sampleState();
  s.optimizer = {{"exp_avg.fc1.weight", at::randn({4, 3})}, {"exp_avg_sq.fc1.weight", at::rand({4, 3})},
                 {"step.fc1.weight", at::scalar_tensor(17, at::kLong)}};
  s.scaler = ScalerState{8192.0, 2.0, 0.5, 100, 37};
  const std::string path = dir_ + "/scaler.pt";
  saveTrainingCheckpoint(s, path);
  const std::string script =
      "import sys, torch; c = torch.load(sys.argv[1]); g = torch.amp.GradScaler('cpu'); "
      "g.load_state_dict(c['scaler']); o = c['optimizer']; "
      "print(g.get_scale(), g._growth_interval, g._init_growth_tracker, o['step.fc1.weight'].item(), "
      "o['exp_avg.fc1.weight'].shape == (4, 3), sorted(c))";
  const std::string out = test::runCommand({DDP_PYTHON, "-c", script, path}, test::CommandOptions()).output;
  EXPECT_EQ(out, "8192.0 100 37 17 True ['checksum', 'config', 'format', 'model', 'optimizer', 'progress', 'rng', "
                 "'scaler']\n");
  const TrainingState r = loadTrainingCheckpoint(path);
  ASSERT_TRUE(r.scaler.has_value());
  EXPECT_EQ(r.scaler->scale, 8192.0);
  EXPECT_EQ(r.scaler->growthInterval, 100);
  EXPECT_EQ(r.scaler->growthTracker, 37);
  EXPECT_EQ(checksumOf(r), checksumOf(s));
  TrainingState t = s;
  t.scaler->growthTracker = 36;
  EXPECT_NE(checksumOf(t), checksumOf(s));  // the scaler is covered by the checksum
}

// A writer killed mid-write leaves ".<name>.tmp.<pid>" (issue 30, 9): the next successful write of
// the same name removes those of dead processes and keeps a live process's own.
TEST_F(Checkpoint, AtomicWritesRemoveTemporariesOfDeadWriters) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // reaped: the pid names no process now
  const std::string dead = dir_ + "/.model.pt.tmp." + std::to_string(child);
  const std::string live = dir_ + "/.model.pt.tmp." + std::to_string(::getppid());
  const std::string other = dir_ + "/.summary.json.tmp." + std::to_string(child);
  for (const auto& path : {dead, live, other}) std::ofstream(path) << "partial";
  writeFileAtomic(dir_ + "/model.pt", "bytes");
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live));   // another job may be writing it
  EXPECT_TRUE(fs::exists(other));  // another name: its own next write cleans it
  EXPECT_EQ(test::readFile(dir_ + "/model.pt"), "bytes");
}

TEST_F(Checkpoint, ChecksumChangesWithAnyField) {
  const TrainingState s = sampleState();
  TrainingState t = sampleState();
  t.model = s.model;
  t.optimizer = s.optimizer;
  t.cpuRng = s.cpuRng;
  EXPECT_EQ(checksumOf(t), checksumOf(s));
  t.stepInEpoch += 1;
  EXPECT_NE(checksumOf(t), checksumOf(s));
  t = accumulatingState();
  const uint32_t accumulating = checksumOf(t);
  t.microSteps = 17 * 4 - 1;
  EXPECT_NE(checksumOf(t), accumulating);
  t.microSteps.reset();
  EXPECT_NE(checksumOf(t), accumulating);
  t = s;
  t.model[0].second = t.model[0].second.clone();
  t.model[0].second[0][0] += 1e-6;
  EXPECT_NE(checksumOf(t), checksumOf(s));
}

TEST_F(Checkpoint, CorruptOrTruncatedFilesAreDetectedAndNamed) {
  const std::string good = dir_ + "/good.pt";
  saveTrainingCheckpoint(sampleState(), good);
  const auto size = fs::file_size(good);
  // Flip one byte inside the tensor data, in the middle of the file.
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string flipped = dir_ + "/flipped.pt";
  size_t dataAt = 0;
  {
    caffe2::serialize::PyTorchStreamReader reader(good);
    dataAt = reader.getRecordOffset("data/0");  // the first tensor's bytes, wherever the writer aligned them
  }
  ASSERT_LT(dataAt + 2, bytes.size());
  std::string damaged = bytes;
  damaged[dataAt + 2] ^= 0x5a;
  std::ofstream(flipped, std::ios::binary) << damaged;
  const std::string m = errorOf([&] { loadTrainingCheckpoint(flipped); });
  EXPECT_NE(m.find("flipped.pt"), std::string::npos) << m;
  EXPECT_NE(m.find("corrupt"), std::string::npos) << m;
  // Read as a model file (eval.model_path, init.model_path, ddp::loadModel) the checksum is verified
  // too (issue 30, 7): the damaged copy is refused, the good one loads.
  struct Holder : torch::nn::Module {
    torch::nn::Linear fc1{nullptr};
    Holder() { fc1 = register_module("fc1", torch::nn::Linear(3, 4)); }
  };
  Holder holder;
  const std::string asModel = errorOf([&] { loadModelFile(holder, flipped); });
  EXPECT_NE(asModel.find("'" + flipped + "' is corrupt: checksum"), std::string::npos) << asModel;
  EXPECT_EQ(errorOf([&] { loadModelFile(holder, good); }), "<no error>");

  const std::string cut = dir_ + "/cut.pt";
  fs::copy_file(good, cut, fs::copy_options::overwrite_existing);
  fs::resize_file(cut, size / 2);
  EXPECT_NE(errorOf([&] { loadTrainingCheckpoint(cut); }).find("cut.pt"), std::string::npos);
  // A model export is not a training checkpoint.
  EXPECT_NE(errorOf([&] { loadTrainingCheckpoint(dir_ + "/gpu_dp_mlp.pt"); }).find("not a ddp-launch training checkpoint"),
            std::string::npos);
}

// Damage that renames the generator's key (found by mutating files at random): a CheckpointError
// naming the file, so resume=auto skips the file, not LibTorch's "tensor does not have a device".
TEST_F(Checkpoint, ACheckpointWithoutItsCpuGeneratorIsCorrupt) {
  const std::string d = dir_ + "/no_rng";
  fs::create_directories(d);
  TrainingState older = sampleState();
  older.globalStep = 1;
  saveTrainingCheckpoint(older, checkpointPath(d, 1));
  const std::string damaged = checkpointPath(d, 2);
  saveTrainingCheckpoint(sampleState(), damaged);
  std::string bytes;
  {
    std::ifstream in(damaged, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  size_t pickleAt = 0, pickleSize = 0;
  {
    caffe2::serialize::PyTorchStreamReader reader(damaged);
    pickleAt = reader.getRecordOffset("data.pkl");
    pickleSize = std::get<1>(reader.getRecord("data.pkl"));
  }
  int renamed = 0;  // every "cpu" of the pickle (the generator's key, the storages' location) → "cpv"
  for (size_t at = bytes.find("cpu", pickleAt); at != std::string::npos && at < pickleAt + pickleSize;
       at = bytes.find("cpu", at + 3)) {
    bytes[at + 2] = 'v';
    ++renamed;
  }
  ASSERT_GT(renamed, 0);
  std::ofstream(damaged, std::ios::binary | std::ios::trunc) << bytes;
  const std::string m = errorOf([&] { loadTrainingCheckpoint(damaged); });
  EXPECT_NE(m.find("'" + damaged + "' is corrupt"), std::string::npos) << m;
  std::vector<std::string> skipped;
  const auto latest = latestValidCheckpoint(d, [&](const std::string& p, const std::string&) { skipped.push_back(p); });
  EXPECT_EQ(latest, std::optional<std::string>(checkpointPath(d, 1)));
  EXPECT_EQ(skipped, std::vector<std::string>{damaged});
}

TEST_F(Checkpoint, LatestValidSkipsACorruptNewestAndPruneKeepsTheLastN) {
  const std::string d = dir_ + "/run";
  fs::create_directories(d);
  for (int64_t step : {10, 20, 30}) {
    TrainingState s = sampleState();
    s.globalStep = step;
    saveTrainingCheckpoint(s, checkpointPath(d, step));
  }
  fs::resize_file(checkpointPath(d, 30), fs::file_size(checkpointPath(d, 30)) / 3);
  std::ofstream(d + "/.ckpt-00000040.pt.tmp.999") << "half a write";
  EXPECT_EQ(listCheckpoints(d).size(), 3u);
  std::vector<std::string> skipped;
  const auto latest = latestValidCheckpoint(d, [&](const std::string& p, const std::string&) { skipped.push_back(p); });
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(*latest, checkpointPath(d, 20));
  EXPECT_EQ(skipped, std::vector<std::string>{checkpointPath(d, 30)});
  EXPECT_EQ(loadTrainingCheckpoint(*latest).globalStep, 20);
  // Unread, for a caller that reads it next (Checkpointer::resume) and goes on past it if damaged.
  EXPECT_EQ(latestValidCheckpoint(d, nullptr, {}, OneFileCheck::kByItsReader), checkpointPath(d, 30));

  pruneCheckpoints(d, 2);
  EXPECT_EQ(listCheckpoints(d), (std::vector<std::string>{checkpointPath(d, 20), checkpointPath(d, 30)}));
  EXPECT_FALSE(fs::exists(d + "/.ckpt-00000040.pt.tmp.999"));
  EXPECT_FALSE(latestValidCheckpoint(dir_ + "/nothing-here", nullptr).has_value());

  // Resumed from 20, the run writes 25 below the damaged 30: keepLast=1 must not take 25.
  TrainingState s = sampleState();
  s.globalStep = 25;
  saveTrainingCheckpoint(s, checkpointPath(d, 25));
  pruneCheckpoints(d, 1, checkpointPath(d, 25));
  EXPECT_EQ(listCheckpoints(d), (std::vector<std::string>{checkpointPath(d, 25), checkpointPath(d, 30)}));
}

// /proc/self/io's rchar: the bytes read(2) and its kin have given this process so far.
int64_t bytesReadSoFar() {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  return -1;
}

// resume=auto read the newest one-file checkpoint whole to pick it, then again to load it: twice
// the bytes, on every rank. Now once; a damaged one is still looked past (by the agreed read), and
// when all are damaged resume is an error, not a fresh start.
TEST_F(Checkpoint, ResumeReadsAOneFileCheckpointOnceAndStillLooksPastADamagedOne) {
  ProcessGroup group = initProcessGroup();  // a group of one (no launcher's environment)
  const std::string d = dir_ + "/read-once";
  torch::nn::Linear net(2048, 2048);  // 16 MiB of weights
  torch::optim::SGD sgd(net->parameters(), 0.1);
  Checkpointer(group, {d}).save(*net, sgd, {0, 1, 1, 8});
  const std::string newest = Checkpointer(group, {d}).save(*net, sgd, {0, 2, 2, 16});
  const auto bytes = static_cast<int64_t>(fs::file_size(newest));
  auto resume = [&](int64_t* read) {
    torch::nn::Linear fresh(2048, 2048);
    torch::optim::SGD freshSgd(fresh->parameters(), 0.1);
    const int64_t before = bytesReadSoFar();
    const auto position = Checkpointer(group, {d}).resume(*fresh, freshSgd);
    *read = bytesReadSoFar() - before;
    EXPECT_TRUE(torch::equal(fresh->weight, net->weight));
    return position.value_or(TrainPosition{}).globalStep;
  };
  int64_t read = 0;
  EXPECT_EQ(resume(&read), 2);
  EXPECT_GE(read, bytes) << "/proc/self/io does not count the checkpoint reader's bytes";
  EXPECT_LT(read, bytes * 3 / 2) << "resume read " << read << " bytes for a " << bytes << "-byte checkpoint";

  fs::resize_file(newest, bytes / 2);
  // And a sharded checkpoint's directory whose manifest is not one, the newest of all: skipped
  // once, not again on each turn past a damaged one-file checkpoint.
  const std::string sharded = d + "/ckpt-00000009";
  fs::create_directories(sharded);
  std::ofstream(sharded + "/manifest.json") << "{}";
  const auto warnings = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  spdlog::default_logger()->sinks().push_back(warnings);
  EXPECT_EQ(resume(&read), 1);
  spdlog::default_logger()->sinks().pop_back();
  int sayings = 0;
  for (const std::string& line : warnings->last_formatted()) sayings += line.find("skipping " + sharded) != std::string::npos;
  EXPECT_EQ(sayings, 1);

  // Every checkpoint damaged: this used to start from the beginning, training again what they
  // hold. Now one error naming the directory, the count and the newest; nothing loaded or removed
  // (a second group cannot be made in this process, so this case lives here).
  const std::string older = checkpointPath(d, 1);
  fs::resize_file(older, fs::file_size(older) / 2);
  torch::nn::Linear fresh(2048, 2048);
  const at::Tensor untouched = fresh->weight.clone();
  torch::optim::SGD freshSgd(fresh->parameters(), 0.1);
  try {
    Checkpointer(group, {d}).resume(*fresh, freshSgd);
    ADD_FAILURE() << "resume started afresh past two damaged checkpoints";
  } catch (const CheckpointsDamagedError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("every checkpoint in " + d + " is damaged (3, the newest " + sharded), std::string::npos)
        << what;
  }
  EXPECT_TRUE(torch::equal(fresh->weight, untouched));
  EXPECT_TRUE(fs::exists(older) && fs::exists(newest));
  group.destroy();
}

}  // namespace
}  // namespace ddp::checkpoint
