// The hang report's analysis on hand-made rings: which rank is behind, which collective it never
// entered, the first sequence number whose calls differ (operation, size, root), send/recv left out,
// and the ring itself written and read back as another process would.
#include <gtest/gtest.h>

#include <vector>

#include "common/flight_recorder.h"
#include "launcher/hang_report.h"

namespace ddp::launcher {
namespace {

flight::Record call(uint64_t seq, const char* op, int64_t numel, flight::State state = flight::State::kDone,
                    int group = 0, int peer = -1) {
  flight::Record r;
  r.seq = seq;
  r.group = group;
  r.op = op;
  r.dtype = numel >= 0 ? "float" : "";
  r.numel = numel;
  r.peer = peer;
  r.state = state;
  r.startNs = 1'000'000'000 * static_cast<int64_t>(seq);
  r.endNs = state == flight::State::kDone ? r.startNs + 1000 : 0;
  return r;
}

RankRing rank(int r, std::vector<flight::Record> records) {
  RankRing ring;
  ring.rank = r;
  ring.pid = 100 + r;
  ring.ring.valid = true;
  ring.ring.rank = r;
  ring.ring.timeoutMs = 3000;
  ring.ring.records = std::move(records);
  return ring;
}

TEST(HangReport, NamesTheRankBehindAndTheCollectiveItNeverEntered) {
  std::vector<RankRing> ranks = {
      rank(0, {call(1, "all_reduce", 10), call(2, "all_reduce", 10), call(3, "barrier", -1, flight::State::kTimedOut)}),
      rank(1, {call(1, "all_reduce", 10), call(2, "all_reduce", 10), call(3, "barrier", -1, flight::State::kTimedOut)}),
      rank(2, {call(1, "all_reduce", 10), call(2, "all_reduce", 10)}),
  };
  const HangFinding f = analyseRings(ranks, 10'000'000'000);
  EXPECT_TRUE(f.timedOut);
  EXPECT_TRUE(f.relevant());
  EXPECT_EQ(f.behind, std::vector<int>{2});
  EXPECT_EQ(f.ahead, (std::vector<int>{0, 1}));
  EXPECT_EQ(f.missingSeq, 3u);
  ASSERT_TRUE(f.missing);
  EXPECT_EQ(f.missing->op, "barrier");
  EXPECT_EQ(f.mismatchSeq, 0u);
  EXPECT_EQ(f.lagging, std::vector<int>{2});
  const auto lines = formatHangReport(ranks, f, {}, 10'000'000'000);
  bool named = false;
  for (const auto& line : lines) named |= line.find("rank 2 is behind: never entered barrier #3") == 0;
  EXPECT_TRUE(named);
}

// A peer that died (its connection reset) fails the others' collective at once, without a
// timeout: the heading says failed, not timed out (a Slurm review: kill -9 of one node's launcher,
// "a collective timed out" after 3.1 s of a 300 s timeout).
TEST(HangReport, ACollectiveThatFailedWithoutATimeoutIsNamedSo) {
  std::vector<RankRing> ranks = {
      rank(0, {call(1, "all_reduce", 10), call(2, "all_reduce", 10, flight::State::kFailed)}),
      rank(1, {call(1, "all_reduce", 10)}),
  };
  const HangFinding f = analyseRings(ranks, 10'000'000'000);
  EXPECT_TRUE(f.failedOnly);
  const auto lines = formatHangReport(ranks, f, {}, 10'000'000'000);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.front().rfind("hang report (a collective failed (a peer's connection broke);", 0), 0u) << lines.front();
  ranks[1].ring.records.push_back(call(2, "all_reduce", 10, flight::State::kTimedOut));
  const auto timedOut = formatHangReport(ranks, analyseRings(ranks, 10'000'000'000), {}, 10'000'000'000);
  EXPECT_EQ(timedOut.front().rfind("hang report (a collective timed out;", 0), 0u) << timedOut.front();
}

TEST(HangReport, FirstMismatchByOperationSizeDtypeAndRoot) {
  {  // a barrier where the others all-reduce
    std::vector<RankRing> ranks = {rank(0, {call(1, "all_reduce", 10), call(2, "all_reduce", 10)}),
                                   rank(1, {call(1, "all_reduce", 10), call(2, "barrier", -1)})};
    const HangFinding f = analyseRings(ranks, 0);
    EXPECT_EQ(f.mismatchSeq, 2u);
    EXPECT_EQ(f.mismatchKind, "different collectives");
    EXPECT_TRUE(f.relevant());
  }
  {  // the same all-reduce over 10 and 9 elements, at #1 (the earliest is named)
    std::vector<RankRing> ranks = {rank(0, {call(1, "all_reduce", 10), call(2, "barrier", -1)}),
                                   rank(1, {call(1, "all_reduce", 9), call(2, "all_reduce", 10)})};
    const HangFinding f = analyseRings(ranks, 0);
    EXPECT_EQ(f.mismatchSeq, 1u);
    EXPECT_EQ(f.mismatchKind, "different sizes");
  }
  {  // the same all-reduce of 4 elements, float on one rank and double on the other: not "sizes"
    flight::Record asDouble = call(1, "all_reduce", 4);
    asDouble.dtype = "double";
    std::vector<RankRing> ranks = {rank(0, {call(1, "all_reduce", 4)}), rank(1, {asDouble})};
    const HangFinding f = analyseRings(ranks, 0);
    EXPECT_EQ(f.mismatchKind, "different dtypes");
    bool hinted = false;
    for (const auto& line : formatHangReport(ranks, f, {}, 10'000'000'000)) {
      hinted |= line.find("(different dtypes)") != std::string::npos && line.find("float on one rank") != std::string::npos;
    }
    EXPECT_TRUE(hinted);
  }
  {  // broadcasts from different roots
    std::vector<RankRing> ranks = {rank(0, {call(1, "broadcast", 4, flight::State::kDone, 0, 0)}),
                                   rank(1, {call(1, "broadcast", 4, flight::State::kDone, 0, 1)})};
    EXPECT_EQ(analyseRings(ranks, 0).mismatchKind, "different roots");
  }
}

TEST(HangReport, PairedCollectivesSendRecvAndSubGroupsAreNotFindings) {
  // Every world collective pairs; send/recv and a sub-group's collectives have their own numbering.
  std::vector<RankRing> ranks = {
      rank(0, {call(1, "all_reduce", 10), call(1, "send", 5, flight::State::kDone, 1000000, 1),
               call(1, "all_reduce", 3, flight::State::kDone, 1)}),
      rank(1, {call(1, "all_reduce", 10), call(1, "recv", 5, flight::State::kDone, 1000000, 0)}),
  };
  const HangFinding f = analyseRings(ranks, 0);
  EXPECT_FALSE(f.relevant());
  EXPECT_TRUE(f.behind.empty());
  EXPECT_EQ(f.mismatchSeq, 0u);
}

TEST(HangReport, AStallIsACollectiveRunningPastItsTimeout) {
  std::vector<RankRing> ranks = {rank(0, {call(1, "all_reduce", 10, flight::State::kRunning)}),
                                 rank(1, {call(1, "all_reduce", 10, flight::State::kRunning)})};
  // Started at 1 s; the timeout is 3 s: at 10 s not stalled (3 + 15 s grace), at 20 s stalled.
  EXPECT_FALSE(analyseRings(ranks, 10'000'000'000).stall);
  EXPECT_TRUE(analyseRings(ranks, 20'000'000'000).stall);
  EXPECT_TRUE(analyseRings(ranks, 5'000'000'000, /*stallAfterMs=*/2000).stall);
  // The launcher stopped with its job (scontrol suspend) until 10 s: the collective runs from then,
  // 10 s at 20 s (no stall), 18.5 s at 28.5 s (a stall).
  EXPECT_FALSE(analyseRings(ranks, 20'000'000'000, 0, /*awakeSinceNs=*/10'000'000'000).stall);
  EXPECT_TRUE(analyseRings(ranks, 28'500'000'000, 0, /*awakeSinceNs=*/10'000'000'000).stall);
}

TEST(FlightRecorder, RingWrittenAndReadBackWrapsAtItsCapacity) {
  std::vector<char> memory(flight::ringBytes(4), 0);
  flight::formatRing(memory.data(), 4);
  auto* header = reinterpret_cast<flight::Header*>(memory.data());
  auto* entries = reinterpret_cast<flight::Entry*>(header + 1);
  EXPECT_FALSE(flight::readRing(memory.data(), memory.size()).valid);  // no rank described yet
  header->rank = 1;
  for (uint64_t seq = 1; seq <= 6; ++seq) {  // as Recorder::begin/end do, six into four slots
    flight::Entry& e = entries[(seq - 1) % 4];
    e.seq = seq;
    e.state = static_cast<uint32_t>(seq == 6 ? flight::State::kRunning : flight::State::kDone);
    e.numel = static_cast<int64_t>(seq) * 10;
    std::snprintf(e.op, sizeof e.op, "all_reduce");
  }
  header->writes = 6;
  const flight::Snapshot snap = flight::readRing(memory.data(), memory.size());
  ASSERT_TRUE(snap.valid);
  ASSERT_EQ(snap.records.size(), 4u);
  EXPECT_EQ(snap.records.front().seq, 3u);  // the two oldest were overwritten
  EXPECT_EQ(snap.records.back().seq, 6u);
  EXPECT_EQ(snap.records.back().numel, 60);
  EXPECT_EQ(snap.records.back().state, flight::State::kRunning);
  EXPECT_FALSE(flight::readRing(memory.data(), memory.size() - 1).valid);  // too small for its capacity
}

TEST(HangReport, AProcessThatIsGoneHasNoStackButAReason) {
  const RankStack none = readStack(999999999, 2);
  EXPECT_TRUE(none.threads.empty());
  EXPECT_FALSE(none.error.empty());
}

}  // namespace
}  // namespace ddp::launcher
