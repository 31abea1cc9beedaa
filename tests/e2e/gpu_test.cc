// GPU paths, end to end: one rank on cuda:0 over a real NCCL group (train,
// export, eval), two ranks sharing cuda:0 over Gloo with CUDA tensors through
// the Reducer, mode dp on cuda:0, CUDA graphs, and the GPT on token shards. Skipped (and reported as skipped) where
// no GPU is visible, as in CI; run on a machine with a GPU.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>
#include <iostream>

#include "tests/support/e2e_models.h"
#include "tests/support/run_command.h"
#include "libddp/runtime/device.h"

namespace ddp {
namespace {

std::string dataRoot() {
  const char* root = std::getenv("DDP_FASHION_MNIST_ROOT");
  return root ? root : "/usr/share/datasets/fashion-mnist";
}

std::string config() { return std::string(DDP_SOURCE_DIR) + "/configs/fmnist_cnn_ddp.yaml"; }

nlohmann::json summaryOf(const std::string& dir) {
  return nlohmann::json::parse(test::readFile(dir + "/summary.json"));
}

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    // Like the worker: ask the driver, then load LibTorch's CUDA half (this binary links the CPU half).
    if (runtime::visibleCudaDevices("auto") == 0) GTEST_SKIP() << "no CUDA GPU visible to this process";
  }
};

// ddp::ProcessGroup's typed collectives (every reduction, kAvg as a sum and a division, NCCL's
// own reduce_scatter, the async forms, CPU tensors staged through the GPU) on a real NCCL group of
// one rank: the tests of tests/libddp/collectives_test.cc that hold for any group size.
TEST_F(Gpu, TypedCollectivesOnOneNcclRank) {
  const auto run = test::runCommand({"/usr/bin/env", "DDP_TEST_BACKEND=nccl", "DDP_TEST_DEVICE=cuda", DDP_LAUNCH_BIN,
                                     "--nproc_per_node=1", DDP_COLLECTIVES_TEST_BIN,
                                     "--gtest_filter=Collectives.AllReduceWithEveryReduction:Collectives.ReduceScatterWithMax:"
                                     "Collectives.AsyncFormsCompleteByWait"},
                                    300);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("[  PASSED  ] 3 tests"), std::string::npos) << run.output;
}

TEST_F(Gpu, OneRankOnNcclTrainsExportsAndEvaluates) {
  const std::string dir = test::makeTempDir("gpu_nccl");
  const auto run = test::runCommand({DDP_LAUNCH_BIN, "--nproc_per_node=1", DDP_WORKER_BIN, config(),
                                     "backend=nccl", "device=cuda", "data.root=" + dataRoot(),
                                     "train.max_steps=200", "output.dir=" + dir},
                                    600);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  const auto summary = summaryOf(dir);
  std::cout << "nccl, 1 rank: " << summary.dump() << std::endl;  // figures for the GPU report
  EXPECT_EQ(summary["backend"], "nccl");
  EXPECT_EQ(summary["device"], "cuda:0");
  EXPECT_GT(summary["test_accuracy"].get<double>(), 0.7);
  EXPECT_GT(summary["cuda_peak_allocated_mb_per_device"][0].get<double>(), 0.0);

  // The export loads in Python PyTorch (plain torch.load, strict keys) to the same accuracy.
  const std::string out = test::runCommand({DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/check_export.py",
                                            dir + "/model.pt", "cnn", "0", dataRoot()},
                                           test::CommandOptions())
                              .output;
  nlohmann::json py;
  ASSERT_NO_THROW(py = nlohmann::json::parse(out)) << out;
  EXPECT_NEAR(py["accuracy"].get<double>(), summary["test_accuracy"].get<double>(), 0.002);

  // mode eval on the GPU reads the export back to the same accuracy.
  const std::string evalDir = dir + "/eval";
  const auto eval = test::runCommand({DDP_WORKER_BIN, config(), "mode=eval", "device=cuda",
                                      "eval.model_path=" + dir + "/model.pt", "data.root=" + dataRoot(),
                                      "output.dir=" + evalDir},
                                     300);
  ASSERT_EQ(eval.exitCode, 0) << eval.output;
  const auto evaluated = nlohmann::json::parse(test::readFile(evalDir + "/eval.json"));
  EXPECT_NEAR(evaluated["test_accuracy"].get<double>(), summary["test_accuracy"].get<double>(), 0.002);
}

TEST_F(Gpu, TwoRanksShareOneGpuOverGlooLikeOnCpu) {
  const std::string gpuDir = test::makeTempDir("gpu_gloo");
  const std::string cpuDir = test::makeTempDir("cpu_gloo");
  const std::vector<std::string> common{DDP_LAUNCH_BIN, "--nproc_per_node=2", DDP_WORKER_BIN, config(),
                                        "backend=gloo", "data.root=" + dataRoot(), "train.max_steps=150"};
  auto gpuArgs = common;
  gpuArgs.insert(gpuArgs.end(), {"device=cuda:0", "output.dir=" + gpuDir});
  auto cpuArgs = common;
  cpuArgs.insert(cpuArgs.end(), {"device=cpu", "output.dir=" + cpuDir});
  const auto gpu = test::runCommand(gpuArgs, 600);
  ASSERT_EQ(gpu.exitCode, 0) << gpu.output;
  const auto cpu = test::runCommand(cpuArgs, 600);
  ASSERT_EQ(cpu.exitCode, 0) << cpu.output;
  const auto g = summaryOf(gpuDir);
  const auto c = summaryOf(cpuDir);
  std::cout << "gloo, 2 ranks on cuda:0: " << g.dump() << "\ngloo, 2 ranks on cpu: " << c.dump() << std::endl;
  EXPECT_EQ(g["device"], "cuda:0");
  EXPECT_EQ(g["backend"], "gloo");
  // Same seed, data and reducer; only the kernels differ (cuDNN vs CPU): results agree closely.
  EXPECT_NEAR(g["test_accuracy"].get<double>(), c["test_accuracy"].get<double>(), 0.02);
  EXPECT_NEAR(g["final_loss"].get<double>(), c["final_loss"].get<double>(), 0.1);
}

TEST_F(Gpu, DataParallelOnCuda) {
  const std::string dir = test::makeTempDir("gpu_dp");
  const auto run = test::runCommand({DDP_WORKER_BIN, config(), "mode=dp", "device=cuda", "dp.device_ids=[0]",
                                     "data.root=" + dataRoot(), "train.max_steps=200", "output.dir=" + dir},
                                    600);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  const auto summary = summaryOf(dir);
  std::cout << "dp on cuda:0: " << summary.dump() << std::endl;
  EXPECT_EQ(summary["mode"], "dp");
  EXPECT_EQ(summary["dp_devices"][0], "cuda:0");
  EXPECT_GT(summary["test_accuracy"].get<double>(), 0.7);
}

// Issue 10: --gpus picks the GPU from NVML's table, the worker reports it, and the loader's threads
// and pinned copies leave a deterministic run bit-identical.
TEST_F(Gpu, GpusAutoPicksFromNvmlAndTheWorkerReportsItsGpu) {
  const std::string dir = test::makeTempDir("gpu_auto");
  const auto run = test::runCommand({DDP_LAUNCH_BIN, "--gpus", "auto:1", "--nproc_per_node=auto", DDP_WORKER_BIN, config(),
                                     "data.root=" + dataRoot(), "train.max_steps=100", "output.dir=" + dir},
                                    600);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  std::cout << run.output.substr(0, 1500) << std::endl;  // the table, for the GPU report
  EXPECT_NE(run.output.find("--gpus auto:1: 1 worker(s) on CUDA_VISIBLE_DEVICES="), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("local rank 0"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("GPU report: rank 0 cuda:0"), std::string::npos) << run.output;
  const auto summary = summaryOf(dir);
  ASSERT_EQ(summary["gpus"].size(), 1u) << summary.dump();
  const auto& g = summary["gpus"][0];
  EXPECT_GT(g["peak_allocated_mb"].get<double>(), 0.0);
  EXPECT_GE(g["peak_reserved_mb"].get<double>(), g["peak_allocated_mb"].get<double>());
  // The bus id the worker saw is one nvidia-smi lists (nvidia-smi writes 00000000:18:00.0, CUDA 0000:18:00.0).
  const std::string smi =
      test::runCommand(test::shellCommand("nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader"), test::stdoutOnly())
          .output;
  std::string bus = g["pci_bus_id"].get<std::string>();
  ASSERT_FALSE(bus.empty());
  bus = bus.substr(bus.find(':') + 1);  // drop the domain, whose width differs
  for (auto& c : bus) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  std::string smiUpper = smi;
  for (auto& c : smiUpper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_NE(smiUpper.find(bus), std::string::npos) << bus << " not in nvidia-smi's " << smi;
}

TEST_F(Gpu, PinnedPrefetchedBatchesGiveTheSameDeterministicRun) {
  const std::string dir = test::makeTempDir("gpu_loader");
  std::string reference;
  for (const std::string& loading : {"data.num_workers=0 data.pin_memory=false", "data.num_workers=2 data.pin_memory=true"}) {
    const std::string out = dir + "/" + std::to_string(reference.size());
    std::vector<std::string> argv = {DDP_LAUNCH_BIN, "--nproc_per_node=1", DDP_WORKER_BIN, config(), "device=cuda",
                                     "data.root=" + dataRoot(), "train.max_steps=100", "eval.enabled=false",
                                     "deterministic_algorithms=true", "cudnn.deterministic=true",
                                     "output.dir=" + out};
    for (size_t at = 0, next; at < loading.size(); at = next + 1) {
      next = loading.find(' ', at);
      if (next == std::string::npos) next = loading.size();
      argv.push_back(loading.substr(at, next - at));
    }
    const auto run = test::runCommand(argv, 600);
    ASSERT_EQ(run.exitCode, 0) << run.output;
    std::cout << loading << ": " << summaryOf(out)["samples_per_s"] << " samples/s" << std::endl;
    const std::string model = test::readFile(out + "/model.pt");
    if (reference.empty()) {
      reference = model;
    } else {
      EXPECT_TRUE(model == reference) << loading << " changed the trained model";
    }
  }
}

// Issue 27: between log steps the GPU step never makes the host wait (LibTorch's sync-debug mode
// set to error there fails the run on any synchronising call): plain SGD with the reducer on at
// one rank (the path of a multi-GPU job: bucket copies, NCCL all-reduces, the device's non-finite
// flag) and fused AdamW. The control run reads a flag on the host every step
// (train.skip_nonfinite_steps with SGD) and must fail: the mode does catch a synchronising call.
std::vector<std::string> oneRankGpu(const std::string& dir, std::vector<std::string> extra) {
  std::vector<std::string> argv{DDP_LAUNCH_BIN, "--nproc_per_node=1", DDP_WORKER_BIN, config(), "backend=nccl",
                                "device=cuda", "data.root=" + dataRoot(), "eval.enabled=false", "output.dir=" + dir};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

TEST_F(Gpu, TheStepNeverWaitsForTheGpuBetweenLogSteps) {
  const std::string dir = test::makeTempDir("gpu_sync");
  for (const std::string optimizer : {"sgd", "adamw"}) {
    const std::string out = dir + "/" + optimizer;
    const auto run = test::runCommand(oneRankGpu(out, {"train.optimizer=" + optimizer, "comm.ddp_on_one_rank=true",
                                                       "cuda.sync_debug=error", "train.max_steps=60",
                                                       "train.log_every=20"}),
                                      600);
    ASSERT_EQ(run.exitCode, 0) << optimizer << ": " << run.output;
    const auto summary = summaryOf(out);
    EXPECT_EQ(summary["steps"], 60) << summary.dump();
    std::cout << optimizer << " under sync-debug error: " << summary["samples_per_s"] << " samples/s" << std::endl;
  }
  // The control: unfused SGD can only skip a non-finite step if the host reads the flag every step.
  const auto control = test::runCommand(oneRankGpu(dir + "/control", {"train.skip_nonfinite_steps=true", "train.fused=false",
                                                                      "cuda.sync_debug=error", "train.max_steps=60",
                                                                      "train.log_every=20"}),
                                        600);
  EXPECT_NE(control.exitCode, 0) << control.output;
  EXPECT_NE(control.output.find("synchroniz"), std::string::npos) << control.output;
}

// The reducer at one rank (comm.ddp_on_one_rank), with and without gradient_as_bucket_view,
// trains the very model the reducer-less run trains: NCCL's sum over one rank and the division by
// 1 are exact, so the exports are byte-identical under deterministic kernels.
TEST_F(Gpu, TheReducerAtOneRankTrainsTheSameModel) {
  const std::string dir = test::makeTempDir("gpu_reducer1");
  std::string reference;
  for (const std::string variant : {"comm.ddp_on_one_rank=false", "comm.ddp_on_one_rank=true",
                                    "comm.gradient_as_bucket_view=false"}) {
    const std::string out = dir + "/" + std::to_string(reference.size() % 7) + variant.substr(5, 4);
    std::vector<std::string> extra{variant, "train.max_steps=80", "deterministic_algorithms=true",
                                   "cudnn.deterministic=true"};
    if (variant == "comm.gradient_as_bucket_view=false") extra.push_back("comm.ddp_on_one_rank=true");
    const auto run = test::runCommand(oneRankGpu(out, extra), 600);
    ASSERT_EQ(run.exitCode, 0) << variant << ": " << run.output;
    const std::string model = test::readFile(out + "/model.pt");
    if (reference.empty()) reference = model;
    else EXPECT_TRUE(model == reference) << variant << " trained another model";
  }
}

// output.profile_start on a GPU: the trace holds the profiled steps (ProfilerStep#0..2) and the
// GPU's side of them (CUPTI kernel records), which a CPU run cannot show.
TEST_F(Gpu, AProfileHoldsTheStepsAndTheirKernels) {
  const std::string dir = test::makeTempDir("gpu_profile");
  const auto run = test::runCommand(oneRankGpu(dir, {"train.max_steps=10", "output.profile_start=5",
                                                     "output.profile_steps=3"}),
                                    600);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  const auto trace = nlohmann::json::parse(test::readFile(dir + "/profile_rank0.json"));
  // Each step is one host span (cat user_annotation); Kineto copies it onto every GPU stream that
  // ran in it (gpu_user_annotation), as in Python's traces.
  std::vector<std::string> steps;
  std::string seen;  // every ProfilerStep span's name and category, for the failure message
  int kernels = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (!e.contains("name") || !e["name"].is_string()) continue;
    const std::string name = e["name"];
    const std::string cat = e.value("cat", std::string());
    if (name.rfind("ProfilerStep#", 0) == 0) {
      seen += name + " (" + cat + ") ";
      if (cat == "user_annotation") steps.push_back(name);
    }
    if (cat == "kernel") ++kernels;
  }
  std::sort(steps.begin(), steps.end());
  EXPECT_EQ(steps, (std::vector<std::string>{"ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"})) << seen;
  EXPECT_GT(kernels, 3) << "no GPU kernel in the trace";
}

// A gradient that overflows on the GPU is found on the device and reported at the next log step
// with the step it happened at: the same step the CPU's per-step check names (bad_input's
// DivergingLearningRate: step 2); nothing is exported.
TEST_F(Gpu, ANonFiniteGradientIsNamedByItsStepFromTheDevice) {
  const std::string dir = test::makeTempDir("gpu_nan");
  for (const std::string variant : {"sgd", "sgd_unfused", "adamw"}) {
    const std::string optimizer = variant == "adamw" ? "adamw" : "sgd";
    const auto run = test::runCommand(
        oneRankGpu(dir + "/" + variant, {"train.optimizer=" + optimizer, "train.lr=1e30", "train.max_steps=50",
                                         "train.log_every=10",
                                         std::string("train.fused=") + (variant == "sgd_unfused" ? "false" : "auto")}),
        600);
    EXPECT_EQ(run.exitCode, 1) << run.output;
    if (variant == "sgd") {  // ddp::FusedSGD (train.fused: auto) skipped it in its kernel
      EXPECT_NE(run.output.find("training diverged: a gradient is NaN or infinite at step 2, which was not applied"),
                std::string::npos)
          << run.output;
    } else if (variant == "sgd_unfused") {  // LibTorch's SGD applied it; nothing after it is saved
      EXPECT_NE(run.output.find("training diverged: a gradient is NaN or infinite at step 2 (the GPU's check"),
                std::string::npos)
          << run.output;
    } else {  // AdamW's first steps are bounded by lr: it may overflow later, never unnamed
      EXPECT_NE(run.output.find("training diverged: a gradient is NaN or infinite at step"), std::string::npos)
          << run.output;
    }
    EXPECT_FALSE(std::ifstream(dir + "/" + variant + "/model.pt").good()) << variant;
  }
}

// train.cuda_graph (issue 27, 3): the step captured after 3 warm-up steps and replayed trains as the
// eager step does (the fused SGD kernel and the captured schedule's learning rate: within float
// rounding), through the reducer and its NCCL all-reduce at one rank, with a cosine schedule and
// clipping (the learning rate is a device tensor the replays read).
TEST_F(Gpu, ACudaGraphTrainsAsTheEagerStepDoes) {
  const std::string dir = test::makeTempDir("gpu_graph");
  const std::vector<std::string> common{"comm.ddp_on_one_rank=true", "train.max_steps=120", "train.log_every=40",
                                        "train.lr_schedule=cosine", "train.warmup_steps=10", "train.clip_grad_norm=1.0",
                                        "eval.enabled=true"};
  auto withGraph = [&](bool graph) {
    auto extra = common;
    extra.push_back(std::string("train.cuda_graph=") + (graph ? "true" : "false"));
    return extra;
  };
  auto eagerArgs = oneRankGpu(dir + "/eager", withGraph(false));
  eagerArgs.erase(std::find(eagerArgs.begin(), eagerArgs.end(), "eval.enabled=false"));
  auto graphArgs = oneRankGpu(dir + "/graph", withGraph(true));
  graphArgs.erase(std::find(graphArgs.begin(), graphArgs.end(), "eval.enabled=false"));
  const auto eager = test::runCommand(eagerArgs, 600);
  ASSERT_EQ(eager.exitCode, 0) << eager.output;
  const auto graph = test::runCommand(graphArgs, 600);
  ASSERT_EQ(graph.exitCode, 0) << graph.output;
  EXPECT_NE(graph.output.find("train.cuda_graph: 117 step(s) replayed from the graph, 3 warm-up step(s), 0 uncaptured"),
            std::string::npos)
      << graph.output;
  const auto e = summaryOf(dir + "/eager");
  const auto g = summaryOf(dir + "/graph");
  std::cout << "eager: " << e["final_loss"] << " " << e["test_accuracy"] << " " << e["samples_per_s"]
            << " samples/s\ngraph: " << g["final_loss"] << " " << g["test_accuracy"] << " " << g["samples_per_s"]
            << " samples/s" << std::endl;
  EXPECT_NEAR(g["final_loss"].get<double>(), e["final_loss"].get<double>(), 0.02);
  EXPECT_NEAR(g["test_accuracy"].get<double>(), e["test_accuracy"].get<double>(), 0.01);
}

// Replays never wait on the host (sync-debug error between log steps), with fused AdamW.
TEST_F(Gpu, ACudaGraphStepNeverWaitsForTheGpu) {
  const std::string dir = test::makeTempDir("gpu_graph_sync");
  const auto run = test::runCommand(oneRankGpu(dir, {"train.cuda_graph=true", "train.optimizer=adamw",
                                                     "comm.ddp_on_one_rank=true", "cuda.sync_debug=error",
                                                     "train.max_steps=60", "train.log_every=20"}),
                                    600);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("train.cuda_graph: 57 step(s) replayed"), std::string::npos) << run.output;
}

// A batch of another shape (each epoch's partial last one) runs its step uncaptured on the same
// tensors, between replays; the run ends as the eager one does.
TEST_F(Gpu, APartialBatchRunsUncapturedBetweenReplays) {
  const std::string dir = test::makeTempDir("gpu_graph_partial");
  // Without the reducer (one rank's default): the graph of a plain step.
  auto args = [&](const std::string& name, bool graph) {
    return std::vector<std::string>{DDP_LAUNCH_BIN, "--nproc_per_node=1", DDP_WORKER_BIN,
                                    std::string(DDP_SOURCE_DIR) + "/configs/synthetic_mlp.yaml", "device=cuda",
                                    "backend=nccl", "data.synthetic_train=200",
                                    "train.batch_size=64", "train.epochs=3", "eval.enabled=false",
                                    std::string("train.cuda_graph=") + (graph ? "true" : "false"),
                                    "output.dir=" + dir + "/" + name};
  };
  const auto eager = test::runCommand(args("eager", false), 600);
  ASSERT_EQ(eager.exitCode, 0) << eager.output;
  const auto graph = test::runCommand(args("graph", true), 600);
  ASSERT_EQ(graph.exitCode, 0) << graph.output;
  // 4 batches per epoch (64, 64, 64, 8): steps 1-3 warm up, 4 (partial) runs eagerly, 5 is captured;
  // 8 and 12 are partial.
  EXPECT_NE(graph.output.find("train.cuda_graph: 6 step(s) replayed from the graph, 3 warm-up step(s), 2 uncaptured"),
            std::string::npos)
      << graph.output;
  EXPECT_EQ(summaryOf(dir + "/graph")["steps"], 12);
  EXPECT_NEAR(summaryOf(dir + "/graph")["final_loss"].get<double>(), summaryOf(dir + "/eager")["final_loss"].get<double>(),
              1e-3);
}


// Issue 42 on the GPU: nanoGPT's GPT on char-level shards of the project's docs, one rank on cuda:0
// over NCCL (the reducer on), bf16 autocast, fused AdamW, clipping, a cosine schedule.
const std::string& gptCorpus() { return test::docsCharCorpus("gpu_lm_corpus"); }

int64_t gptVocabulary() {
  return nlohmann::json::parse(test::readFile(gptCorpus() + "/meta.json"))["vocab_size"].get<int64_t>();
}

std::vector<std::string> gptOnGpu(const std::string& dir, std::vector<std::string> extra) {
  std::vector<std::string> argv{DDP_LAUNCH_BIN, "--nproc_per_node=1", DDP_WORKER_BIN,
                                std::string(DDP_SOURCE_DIR) + "/configs/synthetic_mlp.yaml", "backend=nccl",
                                "device=cuda", "comm.ddp_on_one_rank=true", "model.name=gpt", "model.n_layer=2",
                                "model.n_head=2", "model.n_embd=64", "model.block_size=32", "data.name=tokens",
                                "data.train_files=" + gptCorpus() + "/train_*.bin",
                                "data.val_files=" + gptCorpus() + "/val_*.bin", "train.optimizer=adamw",
                                "train.lr=0.003", "train.weight_decay=0.1", "train.batch_size=16",
                                "train.precision=bf16", "train.lr_schedule=cosine", "train.warmup_steps=10",
                                "train.clip_grad_norm=1.0", "train.log_every=20", "eval.iters=4",
                                "output.dir=" + dir};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// It learns (validation loss well below the uniform ln(vocab)), reports tokens/s and, on a GPU of
// known peak, nanoGPT's MFU in (0, 1); the export is fp32 with nanoGPT's keys and gives the reported
// validation loss in the Python reference on the CPU (fp32 there, bf16 autocast here: within 0.05);
// mode generate on the GPU starts with the prompt and repeats with the seed.
TEST_F(Gpu, GptTrainsInBf16ReportsMfuAndGeneratesOnTheGpu) {
  const std::string dir = test::makeTempDir("gpu_gpt");
  const auto run = test::runCommand(gptOnGpu(dir, {"train.max_steps=200", "eval.interval=100"}), 600);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  const auto summary = summaryOf(dir);
  std::cout << "gpt on cuda, bf16: " << summary.dump() << std::endl;
  EXPECT_LT(summary["val_loss"].get<double>(), 0.7 * std::log(static_cast<double>(gptVocabulary()))) << summary.dump();
  EXPECT_GT(summary["tokens_per_s"].get<double>(), 0);
  const std::string name = summary.value("gpus", nlohmann::json::array()).dump();
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos ||
      name.find("A100") != std::string::npos) {
    ASSERT_TRUE(summary.contains("mfu")) << summary.dump();
    EXPECT_GT(summary["mfu"].get<double>(), 0);
    EXPECT_LT(summary["mfu"].get<double>(), 1);
  }
  for (const auto& [key, tensor] : loadTensors(dir + "/model.pt")) {
    EXPECT_EQ(tensor.scalar_type(), at::kFloat) << key << ": the export is fp32";
  }
  const double reference = test::referenceGptLoss(
      dir + "/model.pt", gptCorpus() + "/val_000000.bin",
      "n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=" + std::to_string(gptVocabulary()), 32, 64);
  EXPECT_NEAR(reference, summary["val_loss"].get<double>(), 0.05);

  const auto generate = [&](const std::string& seed) {
    auto argv = gptOnGpu(dir, {"mode=generate", "generate.start=The", "generate.num_samples=2",
                               "generate.max_new_tokens=40", "seed=" + seed});
    argv.erase(argv.begin(), argv.begin() + 2);  // the worker alone: one process, no group to form
    for (const std::string& key : {"backend=nccl", "comm.ddp_on_one_rank=true"}) {
      argv.erase(std::remove(argv.begin(), argv.end(), key), argv.end());
    }
    const auto g = test::runCommand(argv, 300);
    EXPECT_EQ(g.exitCode, 0) << g.output;
    return nlohmann::json::parse(test::readFile(dir + "/generated.json"))["samples"].get<std::vector<std::string>>();
  };
  const auto first = generate("5");
  ASSERT_EQ(first.size(), 2u);
  for (const auto& sample : first) EXPECT_EQ(sample.rfind("The", 0), 0u) << sample;
  EXPECT_EQ(generate("5"), first);
}

// train.cuda_graph with the GPT (bf16 autocast, fused AdamW, clipping, the schedule's learning rate
// as a device tensor): 3 warm-up steps, then replays that train as the eager step does; neither
// waits for the GPU between log steps (cuda.sync_debug=error).
TEST_F(Gpu, GptCudaGraphTrainsAsTheEagerStepDoesAndNeverWaits) {
  const std::string dir = test::makeTempDir("gpu_gpt_graph");
  const std::vector<std::string> common{"train.max_steps=100", "eval.interval=100", "cuda.sync_debug=error"};
  auto eagerArgs = common;
  eagerArgs.push_back("train.cuda_graph=false");
  auto graphArgs = common;
  graphArgs.push_back("train.cuda_graph=true");
  const auto eager = test::runCommand(gptOnGpu(dir + "/eager", eagerArgs), 600);
  ASSERT_EQ(eager.exitCode, 0) << eager.output;
  const auto graph = test::runCommand(gptOnGpu(dir + "/graph", graphArgs), 600);
  ASSERT_EQ(graph.exitCode, 0) << graph.output;
  EXPECT_NE(graph.output.find("train.cuda_graph: 97 step(s) replayed from the graph, 3 warm-up step(s), 0 uncaptured"),
            std::string::npos)
      << graph.output;
  const auto e = summaryOf(dir + "/eager");
  const auto g = summaryOf(dir + "/graph");
  std::cout << "gpt eager: " << e["val_loss"] << " " << e["tokens_per_s"] << " tokens/s\ngpt graph: " << g["val_loss"]
            << " " << g["tokens_per_s"] << " tokens/s" << std::endl;
  EXPECT_NEAR(g["final_loss"].get<double>(), e["final_loss"].get<double>(), 0.05);
  EXPECT_NEAR(g["val_loss"].get<double>(), e["val_loss"].get<double>(), 0.05);
}


// train.sharding full and zero2 (ddp::fullyShard) on CUDA tensors: two ranks share cuda:0 over Gloo
// (NCCL takes one GPU per rank), the GPT with AdamW's two groups and clipping; the exported weights
// are DDP's (`none`) within float rounding: AdamW's normalised step carries the rounding of the
// clipped gradients into the weights (this job on the CPU over Gloo: 4.4e-6 for both).
TEST_F(Gpu, FullAndZeroTwoShardingOnCudaTrainAsDdpDoes) {
  const std::string dir = test::makeTempDir("gpu_sharding");
  auto job = [&](const std::string& sharding) {
    auto argv = gptOnGpu(dir + "/" + sharding, {"train.sharding=" + sharding, "train.precision=fp32",
                                                "train.max_steps=12", "eval.enabled=false"});
    argv[1] = "--nproc_per_node=2";
    argv.erase(std::remove(argv.begin(), argv.end(), std::string("comm.ddp_on_one_rank=true")), argv.end());
    std::replace(argv.begin(), argv.end(), std::string("backend=nccl"), std::string("backend=gloo"));
    std::replace(argv.begin(), argv.end(), std::string("device=cuda"), std::string("device=cuda:0"));
    const auto r = test::runCommand(argv, 600);
    EXPECT_EQ(r.exitCode, 0) << r.output;
    return r.exitCode == 0 ? loadTensors(dir + "/" + sharding + "/model.pt") : StateDict();
  };
  const StateDict none = job("none");
  ASSERT_FALSE(none.empty());
  for (const std::string sharding : {"full", "zero2"}) {
    const StateDict sharded = job(sharding);
    ASSERT_FALSE(sharded.empty()) << sharding;
    const double worst = test::maxStateDifference(sharded, none);
    std::cout << sharding << " vs none on cuda:0, 2 ranks over gloo: max |difference| " << worst << std::endl;
    EXPECT_LE(worst, 3e-5) << sharding;
  }
}

}  // namespace
}  // namespace ddp
