// The worker's numerics settings (cudnn.*, deterministic_algorithms) and its per-rank reports.
#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <cmath>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "comm/process_group.h"
#include "libddp/internal.h"
#include "worker/config/config.h"
#include "worker/config/startup_checks.h"
#include "worker/report/rank_report.h"
#include "worker/train/metrics.h"
#include "worker/train/optimizer_setup.h"

namespace ddp::worker {
namespace {

// cudnn.* and deterministic_algorithms reach LibTorch's global context, as torch.backends does.
TEST(Numerics, ConfigKeysSetLibTorchsGlobalFlags) {
  const WorkerConfig config = loadConfig("/dev/null", {"cudnn.benchmark=true", "cudnn.deterministic=true",
                                                       "deterministic_algorithms=true"});
  EXPECT_TRUE(config.cudnn.benchmark);
  EXPECT_TRUE(config.cudnn.deterministic);
  EXPECT_TRUE(config.deterministicAlgorithms);
  const WorkerConfig defaults = loadConfig("/dev/null");
  EXPECT_FALSE(defaults.cudnn.benchmark);  // PyTorch's defaults
  EXPECT_FALSE(defaults.cudnn.deterministic);
  EXPECT_FALSE(defaults.deterministicAlgorithms);

  ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
  applyNumerics(loadConfig("/dev/null", {"cudnn.benchmark=true", "cudnn.deterministic=true", "deterministic_algorithms=true"}));
  EXPECT_TRUE(at::globalContext().benchmarkCuDNN());
  EXPECT_TRUE(at::globalContext().deterministicCuDNN());
  EXPECT_TRUE(at::globalContext().deterministicAlgorithms());
  ASSERT_NE(std::getenv("CUBLAS_WORKSPACE_CONFIG"), nullptr);
  EXPECT_STREQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), ":4096:8");
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8", 1);
  applyNumerics(loadConfig("/dev/null", {"deterministic_algorithms=true"}));
  EXPECT_STREQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), ":16:8") << "the user's setting wins";
  applyNumerics(defaults);
  EXPECT_FALSE(at::globalContext().benchmarkCuDNN());
  EXPECT_FALSE(at::globalContext().deterministicCuDNN());
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
}

// Every rank's report survives the trip to rank 0: numbers and the GPU's strings.
TEST(RankReports, StringsAndNumbersReachRankZero) {
  comm::LocalCommunicator one;
  ProcessGroup local = internal::wrapCommunicator(one, c10::Device(c10::kCPU));
  RankReport mine;
  mine.peakRssMb = 233.8;
  mine.ownDataCopy = false;
  mine.device = "cuda:3";
  mine.gpu = GpuUse{"NVIDIA H100 80GB HBM3", "00000000:18:00.0", 81559, 1234.5, 2048};
  const auto reports = gatherRankReports(local, mine);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_DOUBLE_EQ(reports[0].peakRssMb, 233.8);
  EXPECT_FALSE(reports[0].ownDataCopy);
  EXPECT_EQ(reports[0].device, "cuda:3");
  ASSERT_TRUE(reports[0].gpu.has_value());
  EXPECT_EQ(reports[0].gpu->name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(reports[0].gpu->pciBusId, "00000000:18:00.0");
  EXPECT_DOUBLE_EQ(reports[0].gpu->peakReservedMb, 2048);
  const nlohmann::json gpus = gpuSummary(reports);
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0]["rank"], 0);
  EXPECT_EQ(gpus[0]["pci_bus_id"], "00000000:18:00.0");
  EXPECT_DOUBLE_EQ(gpus[0]["peak_allocated_mb"].get<double>(), 1234.5);
  EXPECT_EQ(gpuReportLines(reports).front(),
            "GPU report: rank 0 cuda:3 NVIDIA H100 80GB HBM3 (00000000:18:00.0, 81559 MiB): peak allocated 1234.5 MiB, "
            "reserved 2048.0 MiB");

  const RankReport cpu = measureRank(c10::Device(c10::kCPU), true);
  EXPECT_FALSE(cpu.gpu.has_value());
  EXPECT_GT(cpu.peakRssMb, 1.0);
  EXPECT_TRUE(gpuSummary(gatherRankReports(local, cpu)).empty());
}

// mode: generate at byte level: a sample's bytes need not be UTF-8 (here a cut-off 'é' and a lone
// 0xB4). generated.json is still written, those bytes as U+FFFD (Python's errors="replace").
TEST(Summaries, TextThatIsNotUtf8IsWrittenWithReplacementCharacters) {
  const std::string path = (std::filesystem::temp_directory_path() / "ddp_summary_utf8.json").string();
  writeSummary(path, {{"samples", nlohmann::json::array({std::string("Tao \xc3"), std::string("a\xb4" "b")})}});
  std::ifstream in(path);
  const nlohmann::json read = nlohmann::json::parse(in);
  EXPECT_EQ(read["samples"][0], "Tao \xef\xbf\xbd");
  EXPECT_EQ(read["samples"][1], "a\xef\xbf\xbd" "b");
  std::filesystem::remove(path);
}

// A run split by train.max_steps and resumed (nanoGPT's warm-up of 2000 iterations, a first part
// shorter than that) sets train.decay_steps to the whole schedule: its warm-up is measured against
// that, and the part's lr follows the documented warm-up lr·(k+1)/(W+1). Without decay_steps a
// warm-up that outlasts the run (a short try of a long recipe) stays on that line for the run's
// steps, as nanoGPT's get_lr(it) = lr·(it+1)/(warmup_iters+1) for it < warmup_iters; a decay that
// ends inside the warm-up is refused.
TEST(Schedules, AWarmUpLongerThanASplitRunIsMeasuredAgainstDecaySteps) {
  TrainConfig t;
  t.lr = 0.01;
  t.lrSchedule = LrDecay::kCosine;
  t.warmupSteps = 50;
  const LrSchedule alone = makeSchedule(t, 30, 0);
  for (const int64_t k : {0, 1, 29}) EXPECT_DOUBLE_EQ(alone.at(k), 0.01 * static_cast<double>(k + 1) / 51.0) << k;
  const LrSchedule exactly = makeSchedule(t, 50, 1);  // as long as the run: its last step still below lr
  EXPECT_DOUBLE_EQ(exactly.at(49), 0.01 * 50.0 / 51.0);
  t.decaySteps = 70;
  const LrSchedule schedule = makeSchedule(t, 30, 0);
  for (const int64_t k : {0, 1, 29}) EXPECT_DOUBLE_EQ(schedule.at(k), 0.01 * static_cast<double>(k + 1) / 51.0) << k;
  t.decaySteps = 50;
  EXPECT_THROW(makeSchedule(t, 30, 0), ConfigError);
}

// train.decay_steps shorter than the run: the lr stays at train.min_lr after it, as nanoGPT's get_lr
// returns min_lr for it > lr_decay_iters (it rose again, as CosineAnnealingLR does: 0.02575,
// 0.07525, 0.1 at steps 6-8 of this run).
TEST(Schedules, ACosineStaysAtMinLrAfterDecaySteps) {
  TrainConfig t;
  t.lr = 0.1;
  t.lrSchedule = LrDecay::kCosine;
  t.warmupSteps = 2;
  t.decaySteps = 5;
  t.minLr = 0.001;
  const LrSchedule schedule = makeSchedule(t, 10, -1);
  EXPECT_DOUBLE_EQ(schedule.at(2), 0.1);
  EXPECT_NEAR(schedule.at(4), 0.001 + 0.5 * (1.0 + std::cos(M_PI * 2.0 / 3.0)) * 0.099, 1e-15);
  for (int64_t k = 5; k < 10; ++k) EXPECT_DOUBLE_EQ(schedule.at(k), 0.001) << k;
}

}  // namespace
}  // namespace ddp::worker
