// The bad-input table of README ("Bad input"): each row is a real launch that
// must end with a clear one-line error naming the problem, a non-zero exit,
// nothing half-written in the output directory and no process left behind.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <poll.h>

#include <atomic>
#include <thread>

#include <filesystem>
#include <fstream>

#include "tests/e2e/bad_input_support.h"
#include "tests/support/loopback.h"
#include "tests/support/run_command.h"

namespace ddp {
namespace {

using namespace bad_input;

struct BadInput {
  std::string name;
  /// Builds the ddp-launch arguments (after the binary) for this case.
  std::function<std::vector<std::string>(const Fixture&)> args;
  std::string expected;  // a piece of the error line
  int expectedExit = -1; // -1: any non-zero
};

std::ostream& operator<<(std::ostream& out, const BadInput& c) { return out << c.name; }

std::vector<std::string> worker(std::vector<std::string> extra, const Fixture& f, int nproc = 2,
                                std::vector<std::string> launcherFlags = {}) {
  std::vector<std::string> a = launcherFlags;
  for (const std::string& arg : {"--nproc_per_node=" + std::to_string(nproc), std::string(DDP_WORKER_BIN), kConfig,
                                 "output.dir=" + f.dir + "/out"}) {
    a.push_back(arg);
  }
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

class BadInputTable : public ::testing::TestWithParam<BadInput> {};

TEST_P(BadInputTable, OneClearLineNonZeroExitNothingWrittenNothingLeft) {
  const BadInput c = GetParam();
  Fixture f;
  std::string tmpl = (fs::temp_directory_path() / "ddp_bad_XXXXXX").string();
  f.dir = ::mkdtemp(tmpl.data());
  const int held = test::listenLoopback();
  f.heldPort = test::boundPort(held);
  const int dead = test::listenLoopback();
  f.deadPort = test::boundPort(dead);
  ::close(dead);

  std::vector<std::string> argv = {DDP_LAUNCH_BIN};
  for (auto& a : c.args(f)) argv.push_back(a);
  const auto r = test::runCommand(argv, 90);
  ::close(held);

  EXPECT_FALSE(r.timedOut) << r.output;
  EXPECT_NE(r.exitCode, 0) << r.output;
  if (c.expectedExit >= 0) EXPECT_EQ(r.exitCode, c.expectedExit) << r.output;
  EXPECT_NE(r.output.find(c.expected), std::string::npos) << "expected '" << c.expected << "' in:\n" << r.output;
  // One line per failure, not a C++ backtrace.
  EXPECT_EQ(r.output.find("Exception raised from"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("frame #"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  // Nothing half-written, nobody left behind.
  for (const char* file : {"model.pt", "summary.json"}) EXPECT_FALSE(fs::exists(f.dir + "/out/" + file)) << file;
  EXPECT_EQ(processesMentioning(f.dir), 0) << "a process outlived the launcher";
  fs::remove_all(f.dir);
}

std::string writeFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

// A named pipe nobody writes to: opening it for reading blocks until a writer comes.
std::string fifo(const std::string& path) {
  if (::mkfifo(path.c_str(), 0600) != 0) ADD_FAILURE() << "mkfifo " << path << " failed";
  return path;
}

INSTANTIATE_TEST_SUITE_P(
    Readme, BadInputTable,
    ::testing::Values(
        BadInput{"MissingConfig", [](const Fixture& f) { return std::vector<std::string>{"--nproc_per_node=2", DDP_WORKER_BIN, f.dir + "/none.yaml"}; },
                 "cannot read '", 2},
        BadInput{"GarbledConfig", [](const Fixture& f) {
                   return std::vector<std::string>{"--nproc_per_node=2", DDP_WORKER_BIN,
                                                   writeFile(f.dir + "/bad.yaml", "train: [1, 2\nmodel: {")};
                 }, "YAML syntax error", 2},
        BadInput{"TopLevelNotAMap", [](const Fixture& f) {
                   return std::vector<std::string>{"--nproc_per_node=2", DDP_WORKER_BIN, writeFile(f.dir + "/list.yaml", "- 1\n- 2\n")};
                 }, "top level must be a map", 2},
        BadInput{"ExportNamedLikeTheSummary", [](const Fixture& f) { return worker({"output.export=summary.json"}, f); },
                 "'output.export' is 'summary.json', the name of the run's summary the job writes in output.dir", 2},
        // Issue 46 (17): a job that would train zero steps is refused before training.
        BadInput{"NoTrainingStepToTake", [](const Fixture& f) {
                   return worker({"data.synthetic_train=3", "train.drop_last=true"}, f, 4);
                 }, "config: no training step to take: 3 training samples over 4 ranks leave each none with train.drop_last=true", 2},
        BadInput{"UnknownKey", [](const Fixture& f) { return worker({"trian.lr=0.1"}, f); }, "did you mean 'train.lr'?", 2},
        // No host has GPU 99: without NVML "--gpus 99 needs NVML ...", with it "--gpus 99: GPU 99 does not exist".
        BadInput{"GpusThatDoNotExist", [](const Fixture& f) { return worker({}, f, 2, {"--gpus", "99"}); }, "--gpus 99", 2},
        BadInput{"WrongType", [](const Fixture& f) { return worker({"train.batch_size=many"}, f); },
                 "'train.batch_size' (command-line override) must be an integer, got 'many'", 2},
        BadInput{"NegativeBatchSize", [](const Fixture& f) { return worker({"train.batch_size=-4"}, f); }, "'train.batch_size' must be from 1 to 2147483647", 2},
        BadInput{"NegativeLearningRate", [](const Fixture& f) { return worker({"train.lr=-0.1"}, f); }, "'train.lr' must be > 0", 2},
        BadInput{"NegativeMaxSteps", [](const Fixture& f) { return worker({"train.max_steps=-1"}, f); }, "'train.max_steps' must be >= 0", 2},
        BadInput{"BadMode", [](const Fixture& f) { return worker({"mode=fsdp"}, f); }, "use one of ddp | dp | single | eval", 2},
        BadInput{"OverrideWithoutValue", [](const Fixture& f) { return worker({"train.lr"}, f); }, "must look like dotted.key=value", 2},
        BadInput{"NprocZero", [](const Fixture& f) { return std::vector<std::string>{"--nproc_per_node=0", DDP_WORKER_BIN, kConfig, "output.dir=" + f.dir + "/out"}; },
                 "ddp-launch:", 2},
        BadInput{"UnknownLauncherFlag", [](const Fixture& f) { return std::vector<std::string>{"--nporc_per_node=2", DDP_WORKER_BIN, kConfig, "output.dir=" + f.dir + "/out"}; },
                 "--nproc_per_node", 2},
        BadInput{"WorkerNotFound", [](const Fixture& f) { return std::vector<std::string>{"--nproc_per_node=2", f.dir + "/no-such-worker", kConfig}; },
                 "no-such-worker", 2},
        BadInput{"NodeRankOutOfRange", [](const Fixture& f) { return std::vector<std::string>{"--nnodes=2", "--node_rank=2", DDP_WORKER_BIN, kConfig, "output.dir=" + f.dir + "/out"}; },
                 "node_rank", 2},
        BadInput{"UnreachableMaster", [](const Fixture& f) {
                   // This node is rank 1 of 2; rank 0 never comes.
                   return std::vector<std::string>{"--nnodes=2", "--node_rank=1", "--nproc_per_node=1", "--master_port=" + std::to_string(f.deadPort),
                                                   "--rdzv_token_file=" + tokenFile(f), DDP_WORKER_BIN, kConfig,
                                                   "output.dir=" + f.dir + "/out", "comm.timeout_s=2"};
                 }, "could not reach rank 0 at 127.0.0.1:"},
        // Issue 12: the nodes of a job prove a shared secret; without one, or with one others can read, no start.
        BadInput{"MultiNodeWithoutToken", [](const Fixture& f) {
                   return std::vector<std::string>{"--nnodes=2", "--node_rank=1", "--master_port=" + std::to_string(f.deadPort),
                                                   DDP_WORKER_BIN, kConfig, "output.dir=" + f.dir + "/out"};
                 }, "pass --rdzv_token_file=PATH on each node", 2},
        BadInput{"TokenFileReadableByOthers", [](const Fixture& f) {
                   return std::vector<std::string>{"--nnodes=2", "--node_rank=1", "--master_port=" + std::to_string(f.deadPort),
                                                   "--rdzv_token_file=" + tokenFile(f, 0644), DDP_WORKER_BIN, kConfig,
                                                   "output.dir=" + f.dir + "/out"};
                 }, "has mode 0644: others on this machine could read the job's secret; run: chmod 600", 2},
        // Issue 46 (4): a FIFO is refused at once, not waited on; one character repeated is no secret.
        BadInput{"TokenFileIsAFifo", [](const Fixture& f) {
                   const std::string fifo = f.dir + "/fifo.token";
                   ::mkfifo(fifo.c_str(), 0600);
                   return std::vector<std::string>{"--nnodes=2", "--node_rank=1", "--master_port=" + std::to_string(f.deadPort),
                                                   "--rdzv_token_file=" + fifo, DDP_WORKER_BIN, kConfig, "output.dir=" + f.dir + "/out"};
                 }, "fifo.token' is not a regular file", 2},
        BadInput{"TokenOfOneRepeatedCharacter", [](const Fixture& f) {
                   const std::string path = f.dir + "/weak.token";
                   std::ofstream(path) << std::string(32, 'a') << "\n";
                   ::chmod(path.c_str(), 0600);
                   return std::vector<std::string>{"--nnodes=2", "--node_rank=1", "--master_port=" + std::to_string(f.deadPort),
                                                   "--rdzv_token_file=" + path, DDP_WORKER_BIN, kConfig, "output.dir=" + f.dir + "/out"};
                 }, "holds one character repeated", 2},
        BadInput{"TokenFileMissing", [](const Fixture& f) {
                   return std::vector<std::string>{"--nnodes=2", "--node_rank=1", "--master_port=" + std::to_string(f.deadPort),
                                                   "--rdzv_token_file=" + f.dir + "/none.token", DDP_WORKER_BIN, kConfig,
                                                   "output.dir=" + f.dir + "/out"};
                 }, "none.token': No such file or directory", 2},
        BadInput{"MasterAddrNotOnThisMachine", [](const Fixture& f) {
                   return std::vector<std::string>{"--nproc_per_node=2", "--master_addr=192.0.2.1", DDP_WORKER_BIN, kConfig,
                                                   "output.dir=" + f.dir + "/out"};
                 }, "'192.0.2.1' is not an address of this machine", 2},
        BadInput{"PortInUse", [](const Fixture& f) {
                   return std::vector<std::string>{"--nproc_per_node=2", "--master_port=" + std::to_string(f.heldPort), DDP_WORKER_BIN, kConfig,
                                                   "output.dir=" + f.dir + "/out", "comm.timeout_s=3"};
                 }, "is another job using MASTER_PORT?"},
        BadInput{"MissingDataset", [](const Fixture& f) { return worker({"data.name=fashion-mnist", "data.root=" + f.dir + "/fm"}, f); },
                 "install Debian package dataset-fashion-mnist or set data.root"},
        BadInput{"UnwritableOutputDir", [](const Fixture&) {
                   return std::vector<std::string>{"--nproc_per_node=2", DDP_WORKER_BIN, kConfig, "output.dir=/proc/ddp-out"};
                 }, "cannot create directory '/proc/ddp-out'"},
        BadInput{"IncompatibleModelFile", [](const Fixture& f) {
                   const auto made = test::runCommand({DDP_LAUNCH_BIN, DDP_WORKER_BIN, kConfig, "mode=single", "train.max_steps=2",
                                                       "output.dir=" + f.dir + "/first"}, 60);
                   return worker({"mode=eval", "eval.model_path=" + f.dir + "/first/model.pt", "model.hidden=[128]"}, f, 1);
                 }, "fc1.weight [64, 784] in the file vs [128, 784] in the model"},
        BadInput{"CorruptCheckpoint", [](const Fixture& f) {
                   writeFile(f.dir + "/ckpt.pt", std::string("PK\x03\x04", 4) + "not really a zip archive");
                   return worker({"resume=" + f.dir + "/ckpt.pt"}, f);
                 }, "truncated or corrupt"},
        BadInput{"ResumeFromAModelExport", [](const Fixture& f) {
                   test::runCommand({DDP_LAUNCH_BIN, DDP_WORKER_BIN, kConfig, "mode=single", "train.max_steps=2", "output.dir=" + f.dir + "/first"}, 60);
                   return worker({"resume=" + f.dir + "/first/model.pt"}, f);
                 }, "not a ddp-launch training checkpoint"},
        BadInput{"GpuWithoutGpu", [](const Fixture& f) {
                   // On a GPU machine this row is "LOCAL_RANK 3 needs GPU 3 but only 2 GPU(s) are visible".
                   return worker({"device=cuda:7"}, f);
                 }, "cuda:7"},
        BadInput{"BadDeviceName", [](const Fixture& f) { return worker({"device=gpu0"}, f); }, "use auto, cpu, cuda or cuda:N", 2},
        BadInput{"NcclOnCpu", [](const Fixture& f) { return worker({"backend=nccl", "device=cpu"}, f); }, "backend 'nccl'", 2},
        BadInput{"DpWithManyRanks", [](const Fixture& f) { return worker({"mode=dp"}, f); }, "start it with --nproc_per_node=1", 2},
        BadInput{"EvalWithoutModelPath", [](const Fixture& f) { return worker({"mode=eval"}, f, 1); }, "'eval.model_path' must name the model file", 2},
        // Issue 15: wrong results reported as success.
        // 18 samples over 2 ranks in batches of 4: each rank's last batch holds 1; a ResNet's last
        // BatchNorm then sees one value per channel (PyTorch's error, with what to change).
        BadInput{"BatchOfOneIntoBatchNorm", [](const Fixture& f) {
                   return worker({"model.name=resnet18", "data.synthetic_train=18", "train.batch_size=4"}, f);
                 },
                 "a rank's last batch of the epoch holding 1 sample", 1},
        BadInput{"DivergingLearningRate", [](const Fixture& f) { return worker({"train.lr=1e30"}, f); },
                 "training diverged: a gradient is NaN or infinite at step 2 (epoch 1), so it was not applied", 1},
        BadInput{"DivergingLearningRateInDataParallel", [](const Fixture& f) { return worker({"mode=dp", "train.lr=1e30"}, f, 1); },
                 "training diverged: a gradient is NaN or infinite at step", 1},
        BadInput{"InfiniteLearningRate", [](const Fixture& f) { return worker({"train.lr=.inf"}, f); }, "'train.lr' must be a finite number", 2},
        BadInput{"InfiniteWeightDecay", [](const Fixture& f) { return worker({"train.weight_decay=.inf"}, f); },
                 "'train.weight_decay' must be a finite number", 2},
        BadInput{"ConfigIsADirectory", [](const Fixture& f) { return std::vector<std::string>{"--nproc_per_node=2", DDP_WORKER_BIN, f.dir}; },
                 "' is a directory; pass the path of a YAML config", 2},
        BadInput{"ConfigIsDevZero", [](const Fixture& f) {
                   return std::vector<std::string>{"--nproc_per_node=2", DDP_WORKER_BIN, "/dev/zero", "output.dir=" + f.dir + "/out"};
                 }, "config: '/dev/zero' is larger than 1 MiB", 2},
        BadInput{"DuplicateKey", [](const Fixture& f) {
                   return std::vector<std::string>{"--nproc_per_node=2", DDP_WORKER_BIN,
                                                   writeFile(f.dir + "/dup.yaml", "train:\n  lr: 0.1\n  lr: 0.2\n")};
                 }, "config: key 'train.lr' is given twice", 2},
        BadInput{"DuplicateSection", [](const Fixture& f) {
                   return std::vector<std::string>{"--nproc_per_node=2", DDP_WORKER_BIN,
                                                   writeFile(f.dir + "/dup.yaml", "train:\n  lr: 0.1\ntrain:\n  epochs: 2\n")};
                 }, "config: key 'train' is given twice", 2},
        BadInput{"RanksDisagreeOnMaxSteps", [](const Fixture& f) {
                   // Each rank gets its own train.max_steps (10 + RANK), as a broken job script would do.
                   return std::vector<std::string>{"--nproc_per_node=2", "/bin/sh", "-c",
                                                   std::string("exec ") + DDP_WORKER_BIN + " " + kConfig + " output.dir=" + f.dir +
                                                       "/out train.max_steps=$((10 + RANK))"};
                 }, "config: rank 1 resolved another config than rank 0: train.max_steps=11 here", 2},
        // Hangs and storms.
        BadInput{"RankExitsZeroAtOnce", [](const Fixture& f) {
                   return std::vector<std::string>{"--nproc_per_node=2", "--early_exit_grace_s=2", "/bin/sh", "-c",
                                                   std::string("if [ \"$RANK\" = 1 ]; then exit 0; fi; exec ") + DDP_WORKER_BIN + " " +
                                                       kConfig + " output.dir=" + f.dir + "/out"};
                 }, "ddp-launch: rank 1 (pid", 1},
        BadInput{"ConfigErrorWithManyRestarts", [](const Fixture& f) { return worker({"trian.lr=0.1"}, f, 2, {"--max_restarts=1000000"}); },
                 "not restarting the group: rank", 2},
        BadInput{"UnresolvableMasterAddr", [](const Fixture& f) {
                   return std::vector<std::string>{"--master_addr=not-a-host.invalid", "--master_port=" + std::to_string(f.deadPort),
                                                   DDP_WORKER_BIN, kConfig, "output.dir=" + f.dir + "/out"};
                 }, "--master_addr 'not-a-host.invalid' cannot be resolved", 2},
        BadInput{"TooManyThreads", [](const Fixture& f) { return worker({"threads=100000"}, f); }, "'threads' is 100000 but this machine has", 2},
        BadInput{"HugeModel", [](const Fixture& f) { return worker({"model.hidden=[100000000,100000000]"}, f); },
                 "has 1e+16 parameters: training needs about", 2},
        // mode eval (and generate) build the model too: checked for its weights before it is made.
        BadInput{"HugeModelToEvaluate", [](const Fixture& f) {
                   return worker({"mode=eval", "eval.model_path=" + writeFile(f.dir + "/m.pt", "x"),
                                  "model.hidden=[100000000,100000000]"}, f, 1);
                 }, "has 1e+16 parameters: running it needs about 71.1 PiB (its weights and the file's copy)", 2},
        BadInput{"TimeoutBeyondRange", [](const Fixture& f) { return worker({"comm.timeout_s=1e10"}, f); },
                 "'comm.timeout_s' must be at most 604800 (7 days)", 2},
        // Training recipes (train.optimizer, schedules, clipping).
        BadInput{"UnknownOptimizer", [](const Fixture& f) { return worker({"train.optimizer=adamx"}, f); },
                 "config: 'train.optimizer' is 'adamx'; use sgd, adamw or adam", 2},
        BadInput{"UnknownSchedule", [](const Fixture& f) { return worker({"train.lr_schedule=cosin"}, f); },
                 "config: 'train.lr_schedule' is 'cosin'; use constant, step, cosine or linear", 2},
        BadInput{"NegativeClip", [](const Fixture& f) { return worker({"train.clip_grad_norm=-1"}, f); },
                 "config: 'train.clip_grad_norm' must be a finite number >= 0", 2},
        BadInput{"NesterovWithoutMomentum", [](const Fixture& f) { return worker({"train.nesterov=true", "train.momentum=0"}, f); },
                 "config: 'train.nesterov' needs train.momentum > 0", 2},
        BadInput{"BetasNotAPair", [](const Fixture& f) { return worker({"train.optimizer=adamw", "train.betas=[0.9]"}, f); },
                 "config: 'train.betas' must be two numbers in [0, 1)", 2},
        BadInput{"UnknownPrecision", [](const Fixture& f) { return worker({"train.precision=fp8"}, f); },
                 "config: 'train.precision' is 'fp8'; use fp32, bf16 or fp16", 2},
        BadInput{"MixedPrecisionInModeDp", [](const Fixture& f) { return worker({"mode=dp", "train.precision=bf16"}, f, 1); },
                 "config: 'train.precision' is bf16 but mode dp (DataParallel) trains in fp32 only; use mode ddp", 2},
        BadInput{"SyncBatchNormInModeDp",
                 [](const Fixture& f) { return worker({"mode=dp", "model.name=cnn", "model.batch_norm=true", "model.sync_batch_norm=true"}, f, 1); },
                 "config: 'model.sync_batch_norm' is for mode ddp (as PyTorch's SyncBatchNorm is for "
                 "DistributedDataParallel only): in single, BatchNorm sees the whole batch; in dp, each replica "
                 "normalises its part of the batch", 2},
        // Mode dp: one GPU named (it trained on CPU threads silently), a replica count no machine has
        // cores for (100000 threads, no step in 10 minutes), wire compression it has no wire for (it
        // was ignored), a layer its replicas cannot copy (LibTorch's clone() error).
        BadInput{"DpOnOneNamedGpu", [](const Fixture& f) { return worker({"mode=dp", "device=cuda:1"}, f, 1); },
                 "config: 'device' is cuda:1, one GPU, but mode dp spreads its replicas over dp.device_ids (logical "
                 "ids, default every visible GPU) and gathers on dp.output_device; use device: cuda (or auto) with "
                 "dp.device_ids: [1, ...]", 2},
        BadInput{"DpReplicasBeyondThreads", [](const Fixture& f) { return worker({"mode=dp", "dp.replicas=100000"}, f, 1); },
                 "config: 'dp.replicas' must be from 1 to 64 (CPU replicas, one thread each)", 2},
        BadInput{"DpWithWireCompression", [](const Fixture& f) { return worker({"mode=dp", "comm.compression=fp16"}, f, 1); },
                 "config: 'comm.compression' is fp16, for mode ddp: dp sums its replicas' gradients in one process "
                 "and sends none; set comm.compression: none", 2},
        BadInput{"DpWithUnusedLayer", [](const Fixture& f) { return worker({"mode=dp", "model.unused_layer=true"}, f, 1); },
                 "config: 'model.unused_layer' (a layer forward never reaches, for DDP's find_unused_parameters) is "
                 "for mode ddp and single", 2},
        BadInput{"TrainLimitOnTokens",
                 [](const Fixture& f) {
                   return worker({"model.name=gpt", "data.name=tokens", "data.train_files=" + f.dir + "/none_*.bin",
                                  "data.train_limit=8"}, f, 1);
                 },
                 "config: 'data.train_limit' limits the samples of an image or tensors data set; data.name tokens "
                 "draws windows from its shards: use train.max_steps", 2},
        BadInput{"SyncBatchNormWithoutBatchNorm", [](const Fixture& f) { return worker({"model.sync_batch_norm=true"}, f); },
                 "config: 'model.sync_batch_norm' synchronises BatchNorm layers; use a ResNet (model.name: resnet18, ...) or "
                 "model.name: cnn with model.batch_norm: true", 2},
        // Communication hooks (issue 26, 3).
        BadInput{"UnknownHook", [](const Fixture& f) { return worker({"comm.hook=powersdg"}, f); },
                 "config: 'comm.hook' is 'powersdg'; use none, fp16, bf16 or powersgd", 2},
        BadInput{"HookAndCompression", [](const Fixture& f) { return worker({"comm.hook=powersgd", "comm.compression=fp16"}, f); },
                 "config: 'comm.hook' is powersgd and comm.compression is fp16: compression is a hook itself; set one of them", 2},
        BadInput{"HookInModeDp", [](const Fixture& f) { return worker({"mode=dp", "comm.hook=fp16"}, f, 1); },
                 "config: 'comm.hook' is for mode ddp", 2},
        BadInput{"HookWithFlatReducer", [](const Fixture& f) { return worker({"comm.hook=powersgd", "comm.reducer=flat"}, f); },
                 "config: 'comm.hook' reduces the buckets of the bucketed reducer; set comm.reducer: bucketed", 2},
        BadInput{"PowerSgdStartTooEarly", [](const Fixture& f) { return worker({"comm.hook=powersgd", "comm.powersgd_start_iter=1"}, f); },
                 "config: 'comm.powersgd_start_iter' must be >= 2", 2},
        BadInput{"PowerSgdRankZero", [](const Fixture& f) { return worker({"comm.hook=powersgd", "comm.powersgd_rank=0"}, f); },
                 "config: 'comm.powersgd_rank' must be from 1 to 1024", 2},
        // ZeRO (issue 26, 4).
        BadInput{"ZeroInModeDp", [](const Fixture& f) { return worker({"mode=dp", "train.zero=true"}, f, 1); },
                 "config: 'train.zero' shards the optimizer state over the ranks of mode ddp", 2},
        BadInput{"ZeroWithFusedAdamW", [](const Fixture& f) { return worker({"train.zero=true", "train.optimizer=adamw", "train.fused=true"}, f); },
                 "config: 'train.zero' steps each shard with LibTorch's SGD, Adam or AdamW; set train.fused: auto or false", 2},
        // output.profile_start / output.profile_steps (ddp::Profiler).
        BadInput{"ProfileStepsZero", [](const Fixture& f) { return worker({"output.profile_start=2", "output.profile_steps=0"}, f); },
                 "config: 'output.profile_steps' must be from 1 to 10000 steps", 2},
        BadInput{"ProfileStartNegative", [](const Fixture& f) { return worker({"output.profile_start=-1"}, f); },
                 "config: 'output.profile_start' must be >= 0", 2},
        // train.uneven_inputs (issue 26, 2).
        BadInput{"UnevenInputsUnknown", [](const Fixture& f) { return worker({"train.uneven_inputs=skip"}, f); },
                 "config: 'train.uneven_inputs' is 'skip'; use pad", 2},
        BadInput{"UnevenInputsJoinInModeDp", [](const Fixture& f) { return worker({"mode=dp", "train.uneven_inputs=join"}, f, 1); },
                 "config: 'train.uneven_inputs' join is for mode ddp", 2},
        BadInput{"UnevenInputsJoinWithDropLast", [](const Fixture& f) { return worker({"train.uneven_inputs=join", "train.drop_last=true"}, f); },
                 "config: 'train.uneven_inputs' join has nothing to join with train.drop_last: true", 2},
        BadInput{"UnevenInputsJoinWithSyncBatchNorm",
                 [](const Fixture& f) { return worker({"model.name=cnn", "model.batch_norm=true", "model.sync_batch_norm=true", "train.uneven_inputs=join"}, f); },
                 "config: 'train.uneven_inputs' join cannot run with model.sync_batch_norm", 2},
        BadInput{"ChannelsLastInModeDp", [](const Fixture& f) { return worker({"mode=dp", "train.channels_last=true"}, f, 1); },
                 "config: 'train.channels_last' is for mode ddp and single", 2},
        BadInput{"CudaGraphOnCpu", [](const Fixture& f) { return worker({"device=cpu", "train.cuda_graph=true"}, f); },
                 "config: 'train.cuda_graph' is true but this rank trains on cpu; CUDA graphs need a GPU", 2},
        BadInput{"CudaGraphWithFindUnused",
                 [](const Fixture& f) { return worker({"train.cuda_graph=true", "comm.find_unused_parameters=true"}, f); },
                 "config: 'train.cuda_graph' cannot capture comm.find_unused_parameters", 2},
        BadInput{"CudaGraphWithAccumulation",
                 [](const Fixture& f) { return worker({"train.cuda_graph=true", "train.accumulate_steps=2"}, f); },
                 "config: 'train.cuda_graph' captures one forward and backward per step", 2},
        BadInput{"ActivationCheckpointingInModeDp",
                 [](const Fixture& f) { return worker({"mode=dp", "train.activation_checkpointing=true"}, f, 1); },
                 "config: 'train.activation_checkpointing' is for mode ddp and single", 2},
        BadInput{"ActivationCheckpointingWithSyncBatchNorm",
                 [](const Fixture& f) { return worker({"model.name=cnn", "model.batch_norm=true", "model.sync_batch_norm=true", "train.activation_checkpointing=true"}, f); },
                 "config: 'train.activation_checkpointing' would all-reduce SyncBatchNorm's statistics again", 2},
        BadInput{"SyncDebugOnCpu", [](const Fixture& f) { return worker({"device=cpu", "cuda.sync_debug=error"}, f); },
                 "config: 'cuda.sync_debug' is error but this rank trains on cpu", 2},
        BadInput{"ZeroLossScale", [](const Fixture& f) { return worker({"train.precision=fp16", "train.loss_scale_init=0"}, f); },
                 "config: 'train.loss_scale_init' must be a positive number a float32 holds", 2},
        // Issue 46 (16): values that overflowed or underflowed name their key, before training.
        BadInput{"HugeLossScale", [](const Fixture& f) { return worker({"train.precision=fp16", "train.loss_scale_init=1e300"}, f); },
                 "config: 'train.loss_scale_init' must be a positive number a float32 holds", 2},
        BadInput{"TinyLossScale", [](const Fixture& f) { return worker({"train.precision=fp16", "train.loss_scale_init=1e-300"}, f); },
                 "config: 'train.loss_scale_init' must be a positive number a float32 holds", 2},
        BadInput{"NanosecondTimeout", [](const Fixture& f) { return worker({"comm.timeout_s=1e-9"}, f); },
                 "config: 'comm.timeout_s' must be at least 0.001 (1 ms)", 2},
        BadInput{"EpochsThatOverflowTheStepCount", [](const Fixture& f) {
                   return worker({"train.epochs=4611686018427387904", "train.max_steps=3", "train.lr_schedule=cosine"}, f);
                 }, "config: 'train.epochs' must be from 1 to 1000000000", 2},
        BadInput{"HugeEvalBatch", [](const Fixture& f) { return worker({"eval.batch_size=9223372036854775807"}, f); },
                 "config: 'eval.batch_size' must be from 1 to 2147483647", 2},
        // Robustness, second round (issue 30).
        BadInput{"NamedPipeAsConfig", [](const Fixture& f) {
                   return std::vector<std::string>{"--nproc_per_node=1", DDP_WORKER_BIN, fifo(f.dir + "/f.yaml")};
                 }, "f.yaml' is a named pipe, not a file; pass the path of a YAML config", 2},
        BadInput{"NamedPipeAsResume", [](const Fixture& f) { return worker({"resume=" + fifo(f.dir + "/f.pt")}, f); },
                 "f.pt', a named pipe, not a file; give a checkpoint file, or resume=auto", 2},
        BadInput{"NamedPipeAsInitModel", [](const Fixture& f) { return worker({"init.model_path=" + fifo(f.dir + "/f.pt")}, f); },
                 "f.pt', a named pipe, not a file; give a model file", 2},
        BadInput{"NamedPipeAsEvalModel", [](const Fixture& f) {
                   return worker({"mode=eval", "eval.model_path=" + fifo(f.dir + "/f.pt")}, f, 1);
                 }, "config: 'eval.model_path' is '", 2},
        // A file the run reads at start that is not there: the key, the path and (relative) where it was looked for.
        BadInput{"MissingResumeFile", [](const Fixture& f) { return worker({"resume=" + f.dir + "/nope.pt"}, f); },
                 "nope.pt', which does not exist; give a checkpoint (ckpt-<step>.pt", 2},
        BadInput{"MissingInitModelRelative", [](const Fixture& f) { return worker({"init.model_path=no/such.pt"}, f); },
                 "config: 'init.model_path' is 'no/such.pt' (relative to the working directory /", 2},
        BadInput{"MissingEvalModel", [](const Fixture& f) {
                   return worker({"mode=eval", "eval.model_path=" + f.dir + "/nope.pt"}, f, 1);
                 }, "nope.pt', which does not exist; give a model file", 2},
        BadInput{"EmptyOutputDir", [](const Fixture& f) { return worker({"output.dir="}, f); },
                 "config: 'output.dir' must not be empty", 2},
        BadInput{"EmptyExportName", [](const Fixture& f) { return worker({"output.export="}, f); },
                 "config: 'output.export' must be a file name inside output.dir", 2},
        BadInput{"SectionIsANumber", [](const Fixture& f) {
                   return std::vector<std::string>{"--nproc_per_node=1", DDP_WORKER_BIN,
                                                   writeFile(f.dir + "/n.yaml", "train: 5\n")};
                 }, "must be a map of keys such as train.epochs (got '5')", 2},
        BadInput{"SectionIsAList", [](const Fixture& f) {
                   return std::vector<std::string>{"--nproc_per_node=1", DDP_WORKER_BIN,
                                                   writeFile(f.dir + "/l.yaml", "model: []\n")};
                 }, "config: 'model' in " , 2},
        BadInput{"SectionIsEmpty", [](const Fixture& f) {
                   return std::vector<std::string>{"--nproc_per_node=1", DDP_WORKER_BIN,
                                                   writeFile(f.dir + "/e.yaml", "train: ~\n")};
                 }, "must be a map of keys such as train.epochs (got nothing)", 2},
        BadInput{"TwoYamlDocuments", [](const Fixture& f) {
                   return std::vector<std::string>{"--nproc_per_node=1", DDP_WORKER_BIN,
                                                   writeFile(f.dir + "/two.yaml", "mode: ddp\n---\nmode: dp\n")};
                 }, "holds 2 YAML documents (separated by '---'); a config is one document", 2},
        BadInput{"SyntheticClassesBeyondMemory", [](const Fixture& f) { return worker({"data.synthetic_classes=100000000"}, f); },
                 "and data.synthetic_classes=100000000 need about 1.22 TiB to generate", 2},
        BadInput{"SyntheticSamplesBeyondMemory", [](const Fixture& f) { return worker({"data.synthetic_train=2000000000"}, f); },
                 "config: data.synthetic_train=2000000000, data.synthetic_test=", 2},
        BadInput{"InfiniteBucket", [](const Fixture& f) { return worker({"comm.bucket_cap_mb=.inf"}, f); },
                 "config: 'comm.bucket_cap_mb' must be > 0 and at most 1000000 (MB)", 2},
        BadInput{"HugeFirstBucket", [](const Fixture& f) { return worker({"comm.first_bucket_mb=1e300"}, f); },
                 "config: 'comm.first_bucket_mb' must be > 0 and at most 1000000 (MB)", 2},
        BadInput{"ShutdownGraceBeyondRange", [](const Fixture& f) { return worker({}, f, 2, {"--shutdown_grace_s=1e308"}); },
                 "--shutdown_grace_s must be a number of seconds from 0 to 86400", 2},
        // Messages that pointed the wrong way.
        BadInput{"CheckpointDirIsAFile", [](const Fixture& f) {
                   return worker({"checkpoint.every_steps=5", "checkpoint.dir=" + writeFile(f.dir + "/file", "x")}, f);
                 }, "checkpoint.dir: cannot create directory", 2},
        BadInput{"ResumeIsADirectory", [](const Fixture& f) { return worker({"resume=" + f.dir}, f); }, "config: 'resume' is the directory", 2},
        BadInput{"EvalModelPathIsADirectory", [](const Fixture& f) { return worker({"mode=eval", "eval.model_path=" + f.dir}, f, 1); },
                 "config: 'eval.model_path' is the directory", 2},
        // Found by a docs review: a file a key names is a config error naming the key (were exit 1, or
        // "not a TorchScript file" for a file that does not exist); a missing image root says so.
        BadInput{"TensorFileMissing", [](const Fixture& f) {
                   return worker({"data.name=tensors", "data.train_file=" + f.dir + "/nope.pt",
                                  "data.test_file=" + f.dir + "/nope.pt"}, f);
                 }, "config: 'data.train_file' is '", 2},
        BadInput{"TorchScriptFileMissing", [](const Fixture& f) {
                   return worker({"model.name=torchscript", "model.path=" + f.dir + "/nope.pt"}, f);
                 }, "/nope.pt', which does not exist; give a TorchScript file", 2},
        BadInput{"ImageRootMissing", [](const Fixture& f) {
                   return worker({"data.name=image_folder", "data.root=" + f.dir + "/nope"}, f);
                 }, "/nope' is not a directory; ImageFolder's layout is", 1},
        BadInput{"EmptyMode", [](const Fixture& f) { return worker({"mode="}, f); },
                 "config: 'mode' is ''; use one of ddp | dp | single | eval | generate", 2},
        BadInput{"ExportNameTooLong", [](const Fixture& f) { return worker({"output.export=" + std::string(300, 'x')}, f); },
                 "config: 'output.export': cannot create", 2}),
    [](const auto& info) { return info.param.name; });

// A config every rank refuses alike is printed by the host's first rank only (the others record it
// in their error files for the launcher's summary), not once per rank; the launcher's line names it.
// (Rank 0 may be stopped by the launcher before it prints, when another rank fails first: at most once.)
TEST(BadInput, AConfigErrorIsPrintedOnceNotOncePerRank) {
  const std::string dir = test::makeTempDir("bad_once");
  const auto r = test::runCommand({DDP_LAUNCH_BIN, "--nproc_per_node=4", DDP_WORKER_BIN, kConfig,
                                   "output.dir=" + dir + "/out", "trian.lr=0.1"},
                                  90);
  EXPECT_EQ(r.exitCode, 2) << r.output;
  const std::string line = "worker: config: unknown key 'trian.lr' (command-line override) (did you mean 'train.lr'?)";
  size_t printed = 0;
  for (size_t at = r.output.find("] " + line); at != std::string::npos; at = r.output.find("] " + line, at + 1)) {
    ++printed;
  }
  EXPECT_LE(printed, 1u) << r.output;
  EXPECT_EQ(r.output.find("[rank 1] " + line), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("failed with exit code 2: " + line), std::string::npos) << r.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ddp
