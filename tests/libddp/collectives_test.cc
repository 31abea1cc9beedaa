// The collectives of a user's own loop (ddp::ProcessGroup): all_reduce with every reduction,
// all_gather, reduce_scatter, all_to_all, broadcast, barrier, send/recv, their async forms, per-call
// timeouts and new_group, 3 ranks under ddp-launch (DDP_TEST_BACKEND shm or gloo); expected values
// from formulas of the ranks' inputs. shm refuses send/recv with one line.
#include <ddp/ddp.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
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

// Over ranks r = 0 .. n-1 of valuesOf(r, 0) = 100 r + i: the reductions' values element by element.
torch::Tensor reducedOverRanks(ddp::ReduceOp op, torch::Dtype dtype) {
  const int n = group().size();
  const torch::Tensor i = torch::arange(6, torch::kDouble).reshape({2, 3});
  torch::Tensor product = torch::ones_like(i);
  for (int r = 0; r < n; ++r) product *= i + 100 * r;
  switch (op) {
    case ddp::ReduceOp::kSum: return (n * i + 50 * n * (n - 1)).to(dtype);
    case ddp::ReduceOp::kAvg: return (i + 50 * (n - 1)).to(dtype);
    case ddp::ReduceOp::kProduct: return product.to(dtype);
    case ddp::ReduceOp::kMin: return i.to(dtype);
    case ddp::ReduceOp::kMax: return (i + 100 * (n - 1)).to(dtype);
  }
  return {};
}

// sum over r of (r * 100 + rank * 10 + i): reduce-scatter's result of parts valuesOf(r, k).
torch::Tensor scatteredSum(int rank) {
  const int n = group().size();
  return valuesOf(0, rank) * n + 50 * n * (n - 1);
}

TEST(Collectives, AllReduceWithEveryReduction) {
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kLong}) {
    for (auto op : {ddp::ReduceOp::kSum, ddp::ReduceOp::kAvg, ddp::ReduceOp::kProduct, ddp::ReduceOp::kMin,
                    ddp::ReduceOp::kMax}) {
      // On the collective device: no staging (CUDA tensors on NCCL).
      torch::Tensor t = valuesOf(group().rank(), 0, dtype).to(group().collectiveDevice());
      if (op == ddp::ReduceOp::kAvg && dtype == torch::kLong) {
        try {
          group().allReduce(t, op);
          ADD_FAILURE() << "kAvg accepted an integer tensor";
        } catch (const ddp::ConfigError& e) {
          EXPECT_NE(std::string(e.what()).find("ReduceOp::kAvg needs a floating-point tensor"), std::string::npos)
              << e.what();
        }
        continue;
      }
      group().allReduce(t, op);
      EXPECT_EQ(t.device(), group().collectiveDevice());
      t = t.cpu();
      EXPECT_TRUE(torch::equal(t, reducedOverRanks(op, dtype)))
          << ddp::reduceOpName(op) << " " << dtype << ": " << t << reducedOverRanks(op, dtype);
    }
  }
}

TEST(Collectives, ReduceScatterWithMax) {
  std::vector<torch::Tensor> parts;
  const int n = group().size();
  for (int k = 0; k < n; ++k) parts.push_back(valuesOf(group().rank(), k));
  // max over r of (r * 100 + rank * 10 + i) = 100 (n - 1) + 10 rank + i
  EXPECT_TRUE(torch::equal(group().reduceScatter(parts, ddp::ReduceOp::kMax), valuesOf(n - 1, group().rank())));
  // the mean: 50 (n - 1) + 10 rank + i
  EXPECT_TRUE(torch::equal(group().reduceScatter(parts, ddp::ReduceOp::kAvg), scatteredSum(group().rank()) / n));
}

// Every collective's async form: all started before the first wait, waited in launch order; a
// tensor away from the collective device (a non-contiguous one here) comes back by wait().
TEST(Collectives, AsyncFormsCompleteByWait) {
  const int rank = group().rank();
  const int n = group().size();
  torch::Tensor maxed = valuesOf(rank, 0);
  torch::Tensor strided = valuesOf(rank, 0, torch::kDouble).t();  // not contiguous: staged and copied back
  torch::Tensor fromRoot = valuesOf(rank, 5);
  std::vector<torch::Tensor> gathered, exchanged, parts;
  torch::Tensor scattered;
  for (int k = 0; k < n; ++k) parts.push_back(valuesOf(rank, k));
  ddp::BroadcastOptions last(n - 1);
  last.label = "from the last rank";
  std::vector<ddp::Work> works;
  works.push_back(group().allReduceAsync(maxed, ddp::ReduceOp::kMax));
  works.push_back(group().allReduceAsync(strided, ddp::ReduceOp::kMin));
  works.push_back(group().broadcastAsync(fromRoot, last));
  works.push_back(group().allGatherAsync(gathered, valuesOf(rank, 1)));
  EXPECT_EQ(gathered.size(), static_cast<size_t>(n));  // sized at the start
  works.push_back(group().reduceScatterAsync(scattered, parts));
  works.push_back(group().allToAllAsync(exchanged, parts));
  works.push_back(group().barrierAsync());
  for (ddp::Work& work : works) work.wait();
  EXPECT_TRUE(torch::equal(maxed, reducedOverRanks(ddp::ReduceOp::kMax, torch::kFloat)));
  EXPECT_TRUE(torch::equal(strided, reducedOverRanks(ddp::ReduceOp::kMin, torch::kDouble).t()));
  EXPECT_TRUE(torch::equal(fromRoot, valuesOf(n - 1, 5)));
  ASSERT_EQ(gathered.size(), static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) EXPECT_TRUE(torch::equal(gathered[r], valuesOf(r, 1))) << "from rank " << r;
  EXPECT_TRUE(torch::equal(scattered, scatteredSum(rank)));
  ASSERT_EQ(exchanged.size(), static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) EXPECT_TRUE(torch::equal(exchanged[r], valuesOf(r, rank))) << "from rank " << r;
}

// A collective's own timeout ends it long before the group's (60 s): rank 0 all-reduces alone in
// a group of ranks 0 and 1, and rank 1 joins only after rank 0 has given up (then its own
// all-reduce fails or, where Gloo ran rank 0's on regardless, completes it: either way the group is
// left with nothing in flight).
TEST(Collectives, PerCallTimeoutEndsACollectiveNobodyJoins) {
  std::optional<ddp::ProcessGroup> pair = group().newGroup({0, 1});
  ddp::AllReduceOptions options;
  options.timeout = std::chrono::milliseconds(500);
  torch::Tensor t = torch::ones({4});
  if (group().rank() == 0) {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(pair->allReduce(t, options), ddp::TimeoutError);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 30.0) << "the group's 60 s timeout applied, not the call's 0.5 s";
  }
  group().barrier();  // rank 1 waits here until rank 0 has given up
  if (group().rank() == 1) {
    try {
      pair->allReduce(t, options);
    } catch (const ddp::Error&) {
      // The group broke with rank 0's timeout: expected, and nothing to check here.
    }
  }
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
  const torch::Tensor mine = group().reduceScatter(parts);
  // sum over r of (r * 100 + rank * 10 + i) = 300 + 30 rank + 3 i
  const torch::Tensor expected = valuesOf(0, group().rank()) * 3 + 300;
  EXPECT_TRUE(torch::equal(mine, expected)) << mine << expected;
}

// Rank r's part k of n elements: integers 1..4, exact in every dtype and reduction.
torch::Tensor smallPart(int r, int k, int64_t n, torch::Dtype dtype) {
  return torch::arange(n, torch::kLong).add(3 * k + r).remainder(4).add(1).to(dtype);
}

// Sizes empty, within one chunk and beyond a 4 MiB shm slot (1.5 M elements); every reduction the
// sharded engine uses; bfloat16 where the backend takes it (LibTorch 1.13's Gloo does not).
TEST(Collectives, AllGatherAndReduceScatterOfEverySize) {
  const int rank = group().rank();
  const int n = group().size();
  std::vector<torch::Dtype> dtypes = {torch::kFloat, torch::kDouble, torch::kLong};
  if (group().backend() == ddp::Backend::kShm) dtypes.push_back(torch::kBFloat16);
  for (torch::Dtype dtype : dtypes) {
    for (int64_t numel : {int64_t{0}, int64_t{1000}, int64_t{1'500'001}}) {
      const auto gathered = group().allGather(smallPart(rank, 0, numel, dtype));
      ASSERT_EQ(gathered.size(), static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) {
        EXPECT_TRUE(torch::equal(gathered[r], smallPart(r, 0, numel, dtype))) << "from rank " << r << " " << dtype;
      }
      std::vector<torch::Tensor> parts;
      for (int k = 0; k < n; ++k) parts.push_back(smallPart(rank, k, numel, dtype));
      torch::Tensor sum = torch::zeros({numel}, torch::kDouble), max = sum.clone();
      for (int r = 0; r < n; ++r) {
        sum += smallPart(r, rank, numel, torch::kDouble);
        max = torch::maximum(max, smallPart(r, rank, numel, torch::kDouble));
      }
      EXPECT_TRUE(torch::equal(group().reduceScatter(parts), sum.to(dtype))) << numel << " " << dtype;
      EXPECT_TRUE(torch::equal(group().reduceScatter(parts, ddp::ReduceOp::kMax), max.to(dtype))) << dtype;
      if (dtype != torch::kLong) {
        EXPECT_TRUE(torch::equal(group().reduceScatter(parts, ddp::ReduceOp::kAvg), sum.div(n).to(dtype))) << dtype;
      }
    }
  }
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
  if (group().backend() == ddp::Backend::kShm) {
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
  EXPECT_THROW(group().reduceScatter({torch::ones({1}), torch::ones({1})}), ddp::ConfigError);
  // Issue 46 (14): a root outside the group is refused on every backend, the tensor untouched (shm
  // used to zero it silently).
  torch::Tensor one = torch::ones({1});
  for (int root : {3, 7, -1}) {
    EXPECT_THROW(group().broadcast(one, root), ddp::ConfigError) << "root " << root;
    EXPECT_THROW(group().broadcastAsync(one, root), ddp::ConfigError) << "root " << root;
  }
  EXPECT_EQ(one.item<float>(), 1.0f);
  EXPECT_THROW(group().allToAll({torch::ones({1}), torch::ones({2}), torch::ones({1})}), ddp::ConfigError);
  EXPECT_THROW(group().newGroup({0, 0}), ddp::ConfigError);
  EXPECT_THROW(group().newGroup({0, 3}), ddp::ConfigError);
  // An undefined tensor (a .grad() no backward set): one line, not c10's "tensor does not have a device".
  torch::Tensor none;
  try {
    group().allReduce(none);
    ADD_FAILURE() << "an undefined tensor was all-reduced";
  } catch (const ddp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("ddp::ProcessGroup::allReduce: the tensor is undefined"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(group().broadcast(none, 0), ddp::ConfigError);
  EXPECT_THROW(group().broadcast(std::vector<torch::Tensor>{torch::ones({1}), none}, 0), ddp::ConfigError);
  EXPECT_THROW((void)group().allGather(none), ddp::ConfigError);
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
    pair->allReduce(t);
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
  if (const char* backend = std::getenv("DDP_TEST_BACKEND")) options.backend = ddp::parseBackend(backend).value();
  if (const char* device = std::getenv("DDP_TEST_DEVICE")) options.device = device;
  options.timeout = std::chrono::seconds(60);
  theGroup = ddp::initProcessGroup(options);
  // One rank is enough for the tests written for any size (the GPU test's single NCCL rank runs
  // those, by --gtest_filter).
  if (theGroup->size() != 3 && ::testing::GTEST_FLAG(filter) == "*") {
    std::fprintf(stderr, "collectives_test runs as 3 ranks: ddp-launch --nproc_per_node=3 %s\n", argv[0]);
    return 2;
  }
  const int rc = RUN_ALL_TESTS();
  theGroup->destroy();
  return rc;
}
