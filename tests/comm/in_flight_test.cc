// The NCCL communicator's watch over the collectives it queued (comm/c10d_communicator.h, InFlight):
// with NCCL's wait() returning at once, this is where a peer that never joined becomes our one line
// instead of a host read that hangs until the watchdog aborts. Driven here by works whose completion
// the test controls, as a GPU's events would report it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "comm/c10d_communicator.h"

namespace ddp::comm::detail {
namespace {

struct FakeWork : c10::intrusive_ptr_target {
  std::atomic<bool> done{false};
  std::exception_ptr error;
  bool isCompleted() const { return done.load() || error != nullptr; }
  std::exception_ptr exception() const { return error; }
};
using FakePtr = c10::intrusive_ptr<FakeWork>;

struct Outcome {
  std::string timedOutOp;
  uint64_t number = 0;
  double seconds = -1;
  std::string error;
};

Outcome await(InFlight<FakePtr>& inFlight) {
  Outcome o;
  inFlight.awaitAll(
      [&](const char* op, uint64_t number, double seconds) {
        o.timedOutOp = op;
        o.number = number;
        o.seconds = seconds;
      },
      [&](const char* op, const std::exception& e) { o.error = std::string(op) + ": " + e.what(); });
  return o;
}

TEST(InFlight, ReturnsOnceEveryQueuedWorkHasFinished) {
  InFlight<FakePtr> inFlight(std::chrono::seconds(30));
  auto a = c10::make_intrusive<FakeWork>();
  auto b = c10::make_intrusive<FakeWork>();
  inFlight.add("all_reduce", a);
  inFlight.add("broadcast", b);
  a->done = true;
  // The GPU finishes the second one later, on its own time.
  std::thread gpu([b] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    b->done = true;
  });
  const Outcome o = await(inFlight);
  gpu.join();
  EXPECT_TRUE(o.timedOutOp.empty()) << o.timedOutOp;
  EXPECT_TRUE(o.error.empty()) << o.error;
  EXPECT_TRUE(b->done.load()) << "returned before the last work had finished";
  // Nothing left: the next wait returns at once.
  EXPECT_TRUE(await(inFlight).timedOutOp.empty());
}

TEST(InFlight, NamesTheOldestUnfinishedWorkBeforeTheWatchdogsTimeout) {
  // timeout 4 s: the deadline is 5 % of it (at least 0.1 s, at most 10 s) earlier: 3.8 s after queueing.
  const auto timeout = std::chrono::milliseconds(4000);
  InFlight<FakePtr> inFlight(timeout);
  auto first = c10::make_intrusive<FakeWork>();
  auto stuck = c10::make_intrusive<FakeWork>();
  auto later = c10::make_intrusive<FakeWork>();
  first->done = true;
  inFlight.add("all_reduce", first);
  inFlight.add("broadcast", stuck);  // a peer never joined this one
  inFlight.add("all_reduce", later);
  const auto start = std::chrono::steady_clock::now();
  const Outcome o = await(inFlight);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(o.timedOutOp, "broadcast");
  EXPECT_EQ(o.number, 2u);  // the second work this rank queued
  EXPECT_GE(o.seconds, 3.8);
  EXPECT_LT(o.seconds, 4.0) << "the watchdog (at the timeout) would have aborted first";
  EXPECT_GE(waited, 3.8);
  EXPECT_TRUE(o.error.empty());
}

TEST(InFlight, AnErrorNcclReportedIsRaisedForItsCollective) {
  InFlight<FakePtr> inFlight(std::chrono::seconds(30));
  auto failed = c10::make_intrusive<FakeWork>();
  failed->error = std::make_exception_ptr(std::runtime_error("NCCL error: remote process exited"));
  inFlight.add("all_reduce", failed);
  const Outcome o = await(inFlight);
  EXPECT_EQ(o.error, "all_reduce: NCCL error: remote process exited");
  EXPECT_TRUE(o.timedOutOp.empty());
}

}  // namespace
}  // namespace ddp::comm::detail
