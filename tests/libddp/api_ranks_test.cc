// The public library (libddp.so, <ddp/ddp.h>) as a user's program sees it: every rank runs these
// tests in the same order (their collectives meet), under `ddp-launch --nproc_per_node=2` and on
// its own (a group of one). This file, linked first: the process group, data once per host, the
// straggler monitor, the sampler. DDP: api_ranks_ddp_test.cc; checkpoints and the group's end:
// api_ranks_checkpoint_test.cc.
#include "tests/libddp/api_ranks_support.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

namespace api_ranks {
namespace {

// First of the binary (this file is linked first), so before any test makes the group.
TEST(ProcessGroup, RankBeforeInitProcessGroupIsAConfigError) {
  ASSERT_FALSE(ddp::isInitialized()) << "a test before this one made the group";
  try {
    (void)ddp::rank();
    ADD_FAILURE() << "ddp::rank() answered before initProcessGroup()";
  } catch (const ddp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("call initProcessGroup() first"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)ddp::worldSize(), ddp::ConfigError);
}

TEST(ProcessGroup, ReadsTheEnvContract) {
  const char* world = std::getenv("WORLD_SIZE");
  EXPECT_EQ(group().size(), world ? std::atoi(world) : 1);
  const char* rank = std::getenv("RANK");
  EXPECT_EQ(group().rank(), rank ? std::atoi(rank) : 0);
  EXPECT_EQ(group().device(), c10::Device(c10::kCPU));  // no GPU in this test
  auto t = torch::full({3}, static_cast<double>(group().rank() + 1));
  group().allReduce(t);
  const double w = group().size();
  EXPECT_TRUE(torch::equal(t, torch::full({3}, w * (w + 1) / 2)));  // 1 + 2 + ... + W
  auto b = torch::full({2}, static_cast<double>(group().rank()));
  group().broadcast(b, 0);
  EXPECT_TRUE(torch::equal(b, torch::zeros({2}, torch::kDouble)));
  EXPECT_THROW(ddp::initProcessGroup(), ddp::ConfigError);  // one group per process
}

TEST(ProcessGroup, BeforeGroupRunsOnceWithTheRanksPlace) {
  ddp::ProcessGroup& g = group();
  const BeforeGroup& seen = beforeGroup();
  EXPECT_EQ(seen.calls, 1);
  EXPECT_EQ(seen.rank, g.rank());
  EXPECT_EQ(seen.size, g.size());
  EXPECT_EQ(seen.localRank, g.localRank());
  EXPECT_EQ(seen.localSize, g.localSize());
  EXPECT_EQ(seen.device, g.device().str());
  EXPECT_EQ(seen.timeoutMs, 60000);
}

TEST(LoadOncePerHost, OneRankOfTheHostLoadsTheOthersMapItsCopy) {
  ddp::ProcessGroup& g = group();
  const BeforeGroup& seen = beforeGroup();
  ASSERT_EQ(seen.copy.tensors.size(), 2u);
  EXPECT_TRUE(torch::equal(seen.copy.tensors[0], hostData()));
  EXPECT_TRUE(torch::equal(seen.copy.tensors[1], torch::tensor({3, 1, 4}, torch::kLong)));
  EXPECT_EQ(seen.copy.meta, "rows=4");
  // Over the job (every rank of this test runs on one host): load() ran once, on the rank that
  // shared its copy; every other rank mapped that copy.
  auto counts = torch::tensor({static_cast<double>(seen.loads),
                               seen.copy.origin == ddp::HostCopyOrigin::kSharedByThisRank ? 1.0 : 0.0,
                               seen.copy.origin == ddp::HostCopyOrigin::kMappedFromHostCopy ? 1.0 : 0.0,
                               seen.copy.origin == ddp::HostCopyOrigin::kLoaded ? 1.0 : 0.0},
                              torch::kDouble);
  g.allReduce(counts);
  EXPECT_EQ(counts[0].item<double>(), 1.0);
  if (g.localSize() > 1) {
    EXPECT_EQ(g.localSize(), g.size());
    EXPECT_EQ(counts[1].item<double>(), 1.0);
    EXPECT_EQ(counts[2].item<double>(), g.size() - 1.0);
  } else {
    EXPECT_EQ(counts[3].item<double>(), g.size());  // alone: the data is simply loaded
  }
}

// Issue 45 (7): rank 1 loads its data 80 ms late every step (a sleep, as a slow loader); every other
// rank then waits for it in the gradient all-reduce, and StragglerMonitor names it, by about that.
TEST(StragglerMonitor, NamesTheRankThatArrivesLastAndByHowMuch) {
  torch::manual_seed(2);
  Net net;
  ddp::DistributedDataParallel<Net> model(net, group());
  ddp::StragglerMonitor monitor(group());
  monitor.measure();  // from here on
  const auto x = torch::randn({8, 5});
  const auto y = torch::randn({8, 3});
  constexpr double kLateS = 0.08;
  for (int step = 0; step < 6; ++step) {
    if (group().rank() == 1) std::this_thread::sleep_for(std::chrono::duration<double>(kLateS));
    torch::mse_loss(model(x), y).backward();
  }
  const ddp::StragglerReport report = monitor.measure();
  if (group().size() == 1) {
    EXPECT_EQ(report.straggler, -1);  // nobody to wait for
    return;
  }
  EXPECT_EQ(report.samples, 6);  // one wait per step
  EXPECT_EQ(report.straggler, 1);
  EXPECT_GT(report.skewS, 0.5 * kLateS) << "rank 0 waited " << report.medianWaitS[0] << " s, rank 1 " << report.medianWaitS[1];
  EXPECT_LT(report.skewS, 5 * kLateS);
  EXPECT_GE(report.p95WaitS[0], report.medianWaitS[0]);
  // The next look sees only what came after this one.
  EXPECT_EQ(monitor.measure().samples, 0);
}

TEST(DistributedSampler, ShardsCoverTheDataSetEvenlyAndReshuffleEachEpoch) {
  const int64_t n = 10, w = group().size();
  ddp::DistributedSampler sampler(n, group(), {/*shuffle=*/true, /*seed=*/5});
  EXPECT_EQ(sampler.numSamples(), (n + w - 1) / w);  // ceil(N / W), padded
  auto counts = torch::zeros({n}, torch::kDouble);
  for (int64_t i : sampler.indices()) counts[i] += 1;
  group().allReduce(counts);
  EXPECT_GE(counts.min().item<double>(), 1.0);  // every sample once, the padding's head twice
  EXPECT_EQ(counts.sum().item<double>(), static_cast<double>(sampler.numSamples() * w));
  const auto epoch0 = sampler.indices();
  sampler.setEpoch(1);
  EXPECT_NE(sampler.indices(), epoch0);
  EXPECT_EQ(sampler.batches(3).size(), static_cast<size_t>((sampler.numSamples() + 2) / 3));
  EXPECT_THROW(sampler.batches(0), ddp::ConfigError);
}

// Issue 46 (13): after initProcessGroup a peer's death cannot kill this rank with SIGPIPE (the
// launcher starts workers with it at its default).
TEST(InitProcessGroup, SigpipeIsIgnoredAsInPython) {
  struct sigaction onPipe {};
  ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &onPipe), 0);
  EXPECT_EQ(onPipe.sa_handler, SIG_IGN);
}

// A loop stopped after its first batch resumes at world size 1 from positionAfter() with exactly
// the samples no rank took (unpadded: none twice, none skipped).
TEST(DistributedSampler, PositionAfterResumesAtAnotherWorldSize) {
  const int64_t n = 11, w = group().size(), batch = 2;
  const ddp::SamplerOptions options{/*shuffle=*/true, /*seed=*/3, /*dropLast=*/false, /*pad=*/false};
  ddp::DistributedSampler sampler(n, group(), options);
  sampler.setEpoch(2);
  auto counts = torch::zeros({n}, torch::kDouble);
  const auto batches = sampler.batches(batch);
  for (int64_t i : batches.front()) counts[i] += 1;
  group().allReduce(counts);
  EXPECT_EQ(sampler.samplesInBatches(0, 1, batch), static_cast<int64_t>(counts.sum().item<double>()));
  const int64_t start = sampler.positionAfter(1, batch);
  EXPECT_EQ(start, std::min<int64_t>(n, w * batch));
  ddp::DistributedSampler alone(n, 1, 0, options);
  alone.setEpoch(2, start);
  for (int64_t i : alone.indices()) counts[i] += 1;
  EXPECT_TRUE(counts.eq(1).all().item<bool>()) << counts;
  EXPECT_EQ(alone.batchesPerRank(batch), (n - start + batch - 1) / batch);
}

}  // namespace
}  // namespace api_ranks
