// The collectives of a user's own loop (ddp::ProcessGroup): all_gather, reduce_scatter, all_to_all,
// send/recv and new_group, 3 ranks under ddp-launch (DDP_TEST_BACKEND shm or gloo); expected values
// from formulas of the ranks' inputs. shm refuses send/recv with one line; a recv nobody answers is
// a TimeoutError after the group's timeout.
#include <ddp/ddp.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

namespace {

std::optional<ddp::ProcessGroup> theGroup;
ddp::ProcessGroup& group() { return *theGroup; }

// Rank r's tensor for tag k: values r * 100 + k * 10 + [0, 1, ...], shaped (2, 3).
torch::Tensor valuesOf(int r, int k, torch::Dtype dtype = torch::kFloat) {
  return (torch::arange(6, torch::kDouble) + r * 100 + k * 10).reshape({2, 3}).to(dtype);
}

TEST(Collectives, AllGatherGivesEveryRanksInput) {
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kLong}) {
    const auto out = group().allGather(valuesOf(group().rank(), 0, dtype));
    ASSERT_EQ(out.size(), 3u);
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(torch::equal(out[r], valuesOf(r, 0, dtype))) << "from rank " << r << " " << dtype;
    }
  }
}

TEST(Collectives, ReduceScatterSumsEachRanksPart) {
  std::vector<torch::Tensor> parts;
  for (int k = 0; k < 3; ++k) parts.push_back(valuesOf(group().rank(), k));
  const torch::Tensor mine = group().reduceScatterSum(parts);
  // sum over r of (r * 100 + rank * 10 + i) = 300 + 30 rank + 3 i
  const torch::Tensor expected = valuesOf(0, group().rank()) * 3 + 300;
  EXPECT_TRUE(torch::equal(mine, expected)) << mine << expected;
}

TEST(Collectives, AllToAllDeliversPartKToRankK) {
  std::vector<torch::Tensor> parts;
  for (int k = 0; k < 3; ++k) parts.push_back(valuesOf(group().rank(), k));
  const auto out = group().allToAll(parts);
  ASSERT_EQ(out.size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(torch::equal(out[r], valuesOf(r, group().rank()))) << "from rank " << r;
}

TEST(Collectives, SendRecvAroundTheRingOrRefusedOnShm) {
  const int rank = group().rank();
  const int next = (rank + 1) % 3, prev = (rank + 2) % 3;
  if (group().backend() == "shm") {
    try {
      group().send(valuesOf(rank, 0), next);
      ADD_FAILURE() << "shm accepted send";
    } catch (const ddp::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("the shm backend has no send/recv; use backend gloo"), std::string::npos)
          << e.what();
    }
    return;
  }
  torch::Tensor got = torch::zeros({2, 3});
  if (rank % 2 == 0) {  // no deadlock whatever the transport buffers: evens send first
    group().send(valuesOf(rank, 1), next);
    group().recv(got, prev);
  } else {
    group().recv(got, prev);
    group().send(valuesOf(rank, 1), next);
  }
  EXPECT_TRUE(torch::equal(got, valuesOf(prev, 1)));
}

TEST(Collectives, MisuseIsOneLine) {
  EXPECT_THROW(group().send(torch::ones({1}), 3), ddp::ConfigError);
  EXPECT_THROW(group().send(torch::ones({1}), group().rank()), ddp::ConfigError);
  EXPECT_THROW(group().reduceScatterSum({torch::ones({1}), torch::ones({1})}), ddp::ConfigError);
  EXPECT_THROW(group().allToAll({torch::ones({1}), torch::ones({2}), torch::ones({1})}), ddp::ConfigError);
  EXPECT_THROW(group().newGroup({0, 0}), ddp::ConfigError);
  EXPECT_THROW(group().newGroup({0, 3}), ddp::ConfigError);
}

TEST(Collectives, NewGroupOfRanksZeroAndTwo) {
  std::optional<ddp::ProcessGroup> pair = group().newGroup({2, 0});
  if (group().rank() == 1) {
    EXPECT_FALSE(pair.has_value());
  } else {
    ASSERT_TRUE(pair.has_value());
    EXPECT_EQ(pair->size(), 2);
    EXPECT_EQ(pair->rank(), group().rank() / 2);
    EXPECT_EQ(pair->backend(), group().backend());
    torch::Tensor t = torch::full({4}, static_cast<float>(group().rank() + 1));
    pair->allReduceSum(t);
    EXPECT_TRUE(torch::equal(t, torch::full({4}, 4.0f)));  // (0 + 1) + (2 + 1)
    const auto both = pair->allGather(torch::full({1}, static_cast<float>(group().rank())));
    EXPECT_EQ(both[1].item<float>(), 2.0f);
    pair->destroy();
  }
  group().barrier();  // the world group is unaffected
  std::optional<ddp::ProcessGroup> alone = group().newGroup({1});
  EXPECT_EQ(alone.has_value(), group().rank() == 1);
  if (alone) EXPECT_EQ(alone->size(), 1);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ddp::InitOptions options;
  if (const char* backend = std::getenv("DDP_TEST_BACKEND")) options.backend = backend;
  options.timeout = std::chrono::seconds(60);
  theGroup = ddp::initProcessGroup(options);
  if (theGroup->size() != 3) {
    std::fprintf(stderr, "collectives_test runs as 3 ranks: ddp-launch --nproc_per_node=3 %s\n", argv[0]);
    return 2;
  }
  const int rc = RUN_ALL_TESTS();
  theGroup->destroy();
  return rc;
}
