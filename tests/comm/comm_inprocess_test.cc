// Tier 2: ranks as threads in one process, real ProcessGroupGloo over a real
// TCPStore on loopback. Expected values come from closed-form sums.
#include <gtest/gtest.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <functional>
#include <thread>

#include "comm/process_group.h"
#include "comm/rendezvous.h"
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include "comm/shm_communicator.h"
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include "common/rank_list.h"
#include "tests/comm/thread_ranks.h"
#include "tests/support/loopback.h"
#include "common/error.h"

namespace ddp::comm {
namespace {

using test::hostStore;
using ddp::test::SilentPort;
using test::runRanks;

struct WorldCase {
  int world;
  Backend backend;
};

std::ostream& operator<<(std::ostream& out, const WorldCase& c) {
  return out << backendName(c.backend) << c.world;
}

class CommWorld : public ::testing::TestWithParam<WorldCase> {};

TEST_P(CommWorld, AllReduceSumsOverRanks) {
  const int world = GetParam().world;
  runRanks(world, [world](Communicator& comm) {
    EXPECT_EQ(comm.size(), world);
    at::Tensor t = at::full({1000}, static_cast<float>(comm.rank() + 1));
    comm.allReduce(t)->wait();
    // 1 + 2 + ... + world
    const float expected = world * (world + 1) / 2.0f;
    EXPECT_TRUE(t.eq(expected).all().item<bool>()) << t[0].item<float>();
  }, GetParam().backend);
}

INSTANTIATE_TEST_SUITE_P(Backends, CommWorld,
                         ::testing::Values(WorldCase{2, Backend::kGloo}, WorldCase{3, Backend::kGloo},
                                           WorldCase{4, Backend::kGloo}, WorldCase{2, Backend::kShm},
                                           WorldCase{3, Backend::kShm}, WorldCase{4, Backend::kShm}),
                         [](const auto& info) {
                           std::ostringstream name;
                           name << info.param;
                           return name.str();
                         });

TEST(Shm, LargeTensorsGoThroughInChunksAndEveryDtypeSums) {
  runRanks(3, [](Communicator& comm) {
    const int r = comm.rank();
    // 3 M floats = 12 MB: three 4 MiB chunks, the last one partial.
    at::Tensor big = at::arange(3'000'001, at::kFloat).mul_(r + 1);
    comm.allReduce(big)->wait();
    // (1 + 2 + 3) · i
    EXPECT_TRUE(big.equal(at::arange(3'000'001, at::kFloat).mul_(6))) << big[2999999].item<float>();
    at::Tensor counts = at::tensor({int64_t{r}, int64_t{1} << 40}, at::kLong);
    comm.allReduce(counts)->wait();
    EXPECT_EQ(counts[0].item<int64_t>(), 0 + 1 + 2);
    EXPECT_EQ(counts[1].item<int64_t>(), 3 * (int64_t{1} << 40));
    at::Tensor half = at::full({5}, 0.5 * (r + 1), at::kHalf);
    comm.allReduce(half)->wait();
    EXPECT_EQ(half[4].item<float>(), 3.0f);
    // A non-contiguous tensor (a column) is reduced in place too.
    at::Tensor matrix = at::full({4, 3}, static_cast<float>(r));
    at::Tensor column = matrix.select(1, 1);
    comm.allReduce(column)->wait();
    EXPECT_EQ(matrix[2][1].item<float>(), 3.0f);
    EXPECT_EQ(matrix[2][0].item<float>(), static_cast<float>(r));
    // Broadcast larger than all slots together.
    at::Tensor payload = r == 2 ? at::arange(5'000'000, at::kFloat) : at::zeros({5'000'000});
    comm.broadcast(payload, 2)->wait();
    EXPECT_TRUE(payload.equal(at::arange(5'000'000, at::kFloat)));
  }, Backend::kShm);
}

TEST(Shm, EveryReductionOverChunks) {
  runRanks(3, [](Communicator& comm) {
    const int r = comm.rank();
    // Three chunks again: each rank reduces its share of every chunk with the same operation.
    at::Tensor big = at::arange(3'000'001, at::kFloat).mul_(r + 1);
    comm.allReduce(big, ReduceOp::kMax)->wait();
    EXPECT_TRUE(big.equal(at::arange(3'000'001, at::kFloat).mul_(3)));
    at::Tensor small = at::arange(1, 6, at::kDouble).add_(r);
    comm.allReduce(small, ReduceOp::kMin)->wait();
    EXPECT_TRUE(small.equal(at::arange(1, 6, at::kDouble)));
    at::Tensor factors = at::full({3}, int64_t{r + 2}, at::kLong);
    comm.allReduce(factors, ReduceOp::kProduct)->wait();
    EXPECT_TRUE(factors.equal(at::full({3}, int64_t{2 * 3 * 4}, at::kLong)));
  }, Backend::kShm);
}

// A max on rank 0 against a sum on rank 1: shm compares the calls, no silent mixed result. (The
// segment is broken afterwards, so these ranks are made here rather than by runRanks.)
TEST(Shm, ADifferentReductionDoesNotPair) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      ShmOptions shm;
      shm.rank = r;
      shm.worldSize = 2;
      shm.timeout = std::chrono::seconds(30);
      try {
        auto comm = makeShmCommunicator(store, shm);
        at::Tensor t = at::ones({8});
        comm->allReduce(t, r == 0 ? ReduceOp::kMax : ReduceOp::kSum)->wait();
      } catch (const CommError& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("do not pair"), std::string::npos) << "rank " << r << ": " << errors[r];
    EXPECT_NE(errors[r].find("all_reduce (max) of 8 float"), std::string::npos) << "rank " << r << ": " << errors[r];
  }
}

// Ranks as threads over one shm segment with `chunkBytes` slots (a HashStore, no network): small
// slots put every size through many chunks.
void runShmRanks(int world, size_t chunkBytes, const std::function<void(Communicator&)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      try {
        ShmOptions shm;
        shm.rank = r;
        shm.worldSize = world;
        shm.chunkBytes = chunkBytes;
        shm.timeout = std::chrono::seconds(30);
        auto comm = makeShmCommunicator(store, shm);
        body(*comm);
        comm->barrier()->wait();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// Rank r's part k (k = 0 for an all-gather): integers 1..4, exact in every dtype and reduction.
at::Tensor smallValues(int r, int k, int64_t n, at::ScalarType dtype) {
  return at::arange(n, at::kLong).add(3 * k + r).remainder(4).add(1).to(dtype);
}

// Not integers: their sums round, so the order of summation shows in the bits.
at::Tensor roundingValues(int r, int k, int64_t n, at::ScalarType dtype) {
  return at::arange(n, at::kDouble).mul(0.7371 * (r + 1) + k).sin().mul(1000).to(dtype);
}

// The reduction over ranks of smallValues(r, k), in double, then in `dtype`.
at::Tensor reducedSmallValues(int world, int k, int64_t n, ReduceOp op, at::ScalarType dtype) {
  at::Tensor out = smallValues(0, k, n, at::kDouble);
  for (int r = 1; r < world; ++r) {
    const at::Tensor v = smallValues(r, k, n, at::kDouble);
    if (op == ReduceOp::kSum) out = out.add(v);
    if (op == ReduceOp::kProduct) out = out.mul(v);
    if (op == ReduceOp::kMin) out = out.minimum(v);
    if (op == ReduceOp::kMax) out = out.maximum(v);
  }
  return out.to(dtype);
}

std::vector<at::Tensor> partsOf(int r, int world, int64_t n, at::ScalarType dtype, bool rounding = false) {
  std::vector<at::Tensor> parts;
  for (int k = 0; k < world; ++k) parts.push_back(rounding ? roundingValues(r, k, n, dtype) : smallValues(r, k, n, dtype));
  return parts;
}

class ShmSharding : public ::testing::TestWithParam<int> {};  // the world size

// Native all-gather and reduce-scatter: 1 KiB slots, so 1000 and 4099 elements take many chunks
// (37 fewer than one); every dtype the sharded engine uses, every reduction.
TEST_P(ShmSharding, AllGatherAndReduceScatterOverManyChunksMatchTheFormula) {
  const int world = GetParam();
  runShmRanks(world, 1024, [world](Communicator& comm) {
    const int r = comm.rank();
    for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kLong}) {
      for (int64_t n : {0, 1, 37, 1000, 4099}) {
        std::vector<at::Tensor> gathered;
        comm.allGather(gathered, smallValues(r, 0, n, dtype))->wait();
        ASSERT_EQ(gathered.size(), static_cast<size_t>(world));
        for (int q = 0; q < world; ++q) {
          EXPECT_TRUE(gathered[q].equal(smallValues(q, 0, n, dtype))) << "from rank " << q << ", " << n << " " << dtype;
        }
        for (auto op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
          at::Tensor mine;
          comm.reduceScatter(mine, partsOf(r, world, n, dtype), op)->wait();
          EXPECT_TRUE(mine.equal(reducedSmallValues(world, r, n, op, dtype)))
              << reduceOpName(op) << " of " << n << " " << dtype << " on rank " << r;
        }
      }
    }
    // A shape other than 1-D comes back as it went.
    std::vector<at::Tensor> gathered;
    comm.allGather(gathered, smallValues(r, 0, 60, at::kFloat).reshape({3, 4, 5}))->wait();
    EXPECT_TRUE(gathered[world - 1].equal(smallValues(world - 1, 0, 60, at::kFloat).reshape({3, 4, 5})));
  });
}

// The sums of values that round: bitwise the all-reduce-based default's (the order over ranks is
// the same), so sharded training gives the same bits as before.
TEST_P(ShmSharding, ReduceScatterHasTheBitsOfTheAllReduceDefault) {
  const int world = GetParam();
  runShmRanks(world, 1024, [world](Communicator& comm) {
    const int r = comm.rank();
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kDouble}) {
      for (int64_t n : {1000, 4099}) {
        for (auto op : {ReduceOp::kSum, ReduceOp::kProduct}) {
          const auto parts = partsOf(r, world, n, dtype, /*rounding=*/true);
          at::Tensor native, viaAllReduce;
          comm.reduceScatter(native, parts, op)->wait();
          comm.Communicator::reduceScatter(viaAllReduce, parts, op)->wait();
          EXPECT_TRUE(native.equal(viaAllReduce)) << reduceOpName(op) << " of " << n << " " << dtype;
        }
        std::vector<at::Tensor> native, viaAllReduce;
        comm.allGather(native, roundingValues(r, 0, n, dtype))->wait();
        comm.Communicator::allGather(viaAllReduce, roundingValues(r, 0, n, dtype))->wait();
        for (int q = 0; q < world; ++q) EXPECT_TRUE(native[q].equal(viaAllReduce[q])) << n << " " << dtype;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShmSharding, ::testing::Values(2, 3));

// All-gathers and reduce-scatters use the slots' halves in turn with one arrival per chunk; an
// all-reduce or a broadcast after them must not overwrite a half a peer still reads.
TEST(Shm, InterleavedCollectivesKeepTheirSlotsApart) {
  runShmRanks(3, 1024, [](Communicator& comm) {
    const int r = comm.rank();
    for (int step = 0; step < 24; ++step) {
      const int64_t n = 1 + (97 * step) % 700;
      std::vector<at::Tensor> gathered;
      comm.allGather(gathered, smallValues(r, step, n, at::kFloat))->wait();
      for (int q = 0; q < 3; ++q) ASSERT_TRUE(gathered[q].equal(smallValues(q, step, n, at::kFloat))) << step;
      at::Tensor summed = smallValues(r, step, n, at::kFloat);
      if (step % 2 == 0) {
        comm.allReduce(summed)->wait();
        ASSERT_TRUE(summed.equal(reducedSmallValues(3, step, n, ReduceOp::kSum, at::kFloat))) << step;
      }
      at::Tensor mine;
      comm.reduceScatter(mine, partsOf(r, 3, n, at::kDouble), ReduceOp::kMax)->wait();
      ASSERT_TRUE(mine.equal(reducedSmallValues(3, r, n, ReduceOp::kMax, at::kDouble))) << step;
      at::Tensor payload = r == step % 3 ? smallValues(r, step, 3 * n, at::kLong) : at::zeros({3 * n}, at::kLong);
      if (step % 3 != 1) comm.broadcast(payload, step % 3)->wait();
      if (step % 3 != 1) ASSERT_TRUE(payload.equal(smallValues(step % 3, step, 3 * n, at::kLong))) << step;
      if (step % 5 == 0) comm.barrier()->wait();
    }
  });
}

// Larger than a whole slot at the default size (4 MiB): 1.5 M floats per rank.
TEST(Shm, AllGatherAndReduceScatterLargerThanASlot) {
  runRanks(3, [](Communicator& comm) {
    const int r = comm.rank();
    const int64_t n = 1'500'001;
    std::vector<at::Tensor> gathered;
    comm.allGather(gathered, smallValues(r, 0, n, at::kFloat))->wait();
    for (int q = 0; q < 3; ++q) EXPECT_TRUE(gathered[q].equal(smallValues(q, 0, n, at::kFloat))) << q;
    at::Tensor mine;
    comm.reduceScatter(mine, partsOf(r, 3, n, at::kFloat), ReduceOp::kSum)->wait();
    EXPECT_TRUE(mine.equal(reducedSmallValues(3, r, n, ReduceOp::kSum, at::kFloat)));
  }, Backend::kShm);
}

TEST(Shm, AnAllGatherAgainstAReduceScatterDoesNotPair) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      ShmOptions shm;
      shm.rank = r;
      shm.worldSize = 2;
      shm.timeout = std::chrono::seconds(30);
      try {
        auto comm = makeShmCommunicator(store, shm);
        std::vector<at::Tensor> out;
        at::Tensor mine;
        if (r == 0) comm->allGather(out, at::ones({8}))->wait();
        if (r == 1) comm->reduceScatter(mine, {at::ones({4}), at::ones({4})})->wait();
      } catch (const CommError& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("do not pair"), std::string::npos) << "rank " << r << ": " << errors[r];
    EXPECT_NE(errors[r].find("all_gather of 8 float"), std::string::npos) << "rank " << r << ": " << errors[r];
    EXPECT_NE(errors[r].find("reduce_scatter of 8 float"), std::string::npos) << "rank " << r << ": " << errors[r];
  }
}

TEST(Shm, ARankThatNeverComesIsATimeoutNotAHang) {
  std::string error;
  std::thread lonely([&] {
    try {
      auto store = c10::make_intrusive<c10d::HashStore>();
      ShmOptions shm;
      shm.worldSize = 2;  // rank 1 never comes
      shm.timeout = std::chrono::milliseconds(1500);
      makeShmCommunicator(store, shm);
    } catch (const TimeoutError& e) {
      error = e.what();
    }
  });
  lonely.join();
  EXPECT_NE(error.find("within 1.5 s"), std::string::npos) << error;
}

TEST(Rendezvous, TimeoutNamesTheMissingRanks) {
  // The store is hosted here on a kernel-chosen port (as torchrun's agent hosts it), so both ranks
  // are clients with the same timeout and nothing can take the port in between.
  auto host = hostStore();
  const uint16_t port = host->getPort();
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  // World of 3, only ranks 0 and 1 come.
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        RendezvousOptions rdv;
        rdv.masterPort = port;
        rdv.rank = r;
        rdv.worldSize = 3;
        rdv.storeServedElsewhere = true;
        rdv.timeout = std::chrono::seconds(3);
        rendezvous(rdv);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    EXPECT_NE(e.find("2/3 ranks joined (missing: 2)"), std::string::npos) << e;
  }
}

// At a large world size the missing ranks are ranges (issue 30, 11): one short line, not one
// number per rank (59 KB at 10 000 ranks before).
TEST(Rendezvous, MissingRanksOfALargeWorldAreRanges) {
  EXPECT_EQ(rankRanges({2, 3, 4, 7, 9, 10}), "2-4, 7, 9-10");
  EXPECT_EQ(rankRanges({}), "");
  std::vector<int> every;
  for (int r = 0; r < 100; r += 2) every.push_back(r);  // 50 separate ranks
  EXPECT_EQ(rankRanges(every, 3), "0, 2, 4, ... (47 more ranks)");
  auto host = hostStore();
  const uint16_t port = host->getPort();
  std::string error;
  std::thread rank0([&] {
    try {
      RendezvousOptions rdv;
      rdv.masterPort = port;
      rdv.rank = 0;
      rdv.worldSize = 2000;
      rdv.storeServedElsewhere = true;
      rdv.timeout = std::chrono::seconds(2);
      rendezvous(rdv);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  rank0.join();
  EXPECT_NE(error.find("1/2000 ranks joined (missing: 1-1999)"), std::string::npos) << error;
}

// 100 000 ranks (issue 30, 11): the census of the absent ranks takes a few requests per 1024 ranks
// and at most 2 s (ranks it had no time to name are counted: "... (N more ranks)"), so the timeout
// line comes before the start-up watchdog (timeout + 5 s) would blame an unanswering store.
TEST(Rendezvous, AHundredThousandRanksTimeOutWithTheRendezvousLine) {
  auto host = hostStore();
  const uint16_t port = host->getPort();
  std::string error;
  const auto started = std::chrono::steady_clock::now();
  std::thread rank0([&] {
    try {
      RendezvousOptions rdv;
      rdv.masterPort = port;
      rdv.rank = 0;
      rdv.worldSize = 100000;
      rdv.storeServedElsewhere = true;
      rdv.timeout = std::chrono::seconds(2);
      rendezvous(rdv);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  rank0.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_NE(error.find("1/100000 ranks joined (missing: 1-"), std::string::npos) << error;
  EXPECT_LT(error.size(), 400u) << error;
  EXPECT_LT(seconds, 2 + 5) << "the census outlasted the start-up watchdog's limit";
}

TEST(Rendezvous, AStoreServedElsewhereKeepsEachAttemptApart) {
  // torchrun's static agent keeps one store across restarts: attempt 0's joins must not count
  // for attempt 1, where rank 1 never comes.
  auto host = hostStore();
  auto join = [&](int rank, int attempt, std::chrono::milliseconds timeout) {
    RendezvousOptions rdv;
    rdv.masterPort = host->getPort();
    rdv.rank = rank;
    rdv.worldSize = 2;
    rdv.storeServedElsewhere = true;
    rdv.attempt = attempt;
    rdv.timeout = timeout;
    return rendezvous(rdv);
  };
  std::thread other([&] { join(1, 0, std::chrono::seconds(30)); });
  join(0, 0, std::chrono::seconds(30));
  other.join();
  try {
    join(0, 1, std::chrono::seconds(1));
    FAIL() << "attempt 1 completed with attempt 0's joins";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("1/2 ranks joined (missing: 1)"), std::string::npos) << e.what();
  }
}

TEST(Rendezvous, UnreachableMasterIsATimeoutThatSaysWhere) {
  SilentPort silent;  // bound, nobody listens: connections are refused until the timeout
  const uint16_t port = silent.port();
  RendezvousOptions rdv;
  rdv.masterPort = port;
  rdv.rank = 1;
  rdv.worldSize = 2;
  rdv.timeout = std::chrono::seconds(1);
  try {
    rendezvous(rdv);
    FAIL() << "no error";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
  }
}

TEST(ProcessGroup, WorldOfOneNeedsNoNetwork) {
  ProcessGroupOptions pg;
  auto comm = makeCommunicator({}, pg);
  EXPECT_EQ(comm->size(), 1);
  at::Tensor t = at::ones({2});
  comm->allReduce(t)->wait();
  EXPECT_EQ(t.sum().item<float>(), 2.0f);
}

TEST(Backend, AutoAndExplicitChoices) {
  EXPECT_EQ(resolveBackend(Backend::kAuto, /*deviceIsCuda=*/false, /*singleHost=*/false), Backend::kGloo);
  EXPECT_EQ(resolveBackend(Backend::kAuto, false, /*singleHost=*/true), Backend::kShm);
  EXPECT_EQ(resolveBackend(Backend::kGloo, false, true), Backend::kGloo);
  EXPECT_EQ(resolveBackend(Backend::kShm, false, true), Backend::kShm);
  EXPECT_THROW(resolveBackend(Backend::kShm, false, /*singleHost=*/false), ConfigError);
  EXPECT_THROW(resolveBackend(Backend::kShm, /*deviceIsCuda=*/true, true), ConfigError);
  EXPECT_EQ(parseBackend("shm"), Backend::kShm);
  EXPECT_THROW(resolveBackend(Backend::kNccl, false), ConfigError);
  EXPECT_THROW(parseBackend("mpi"), ConfigError);
  if (ncclCompiled()) {
    EXPECT_EQ(resolveBackend(Backend::kAuto, true), Backend::kNccl);
  } else {
    EXPECT_EQ(resolveBackend(Backend::kAuto, true), Backend::kGloo);
  }
}

}  // namespace
}  // namespace ddp::comm
