// The collective flight recorder: every rank keeps its last N collectives (sequence number,
// operation, size, dtype, group, start and end time, state) in a ring of plain memory. Under
// ddp-launch that memory is a memfd the launcher made and keeps: the launcher reads every rank's
// ring at any time, also of a rank that is stopped (state T), spinning in its own code, or gone,
// and names the rank that is behind, the collective it never entered, and ranks whose collectives
// do not pair (launcher/hang_report.h). Without ddp-launch the ring is anonymous memory of the
// rank. No LibTorch here: the launcher reads the same layout.
//
// Writing an entry costs one atomic add, two clock reads (start, end) and a few stores: no lock,
// no allocation, no system call (vDSO clock). Entries are published seqlock-style (the sequence
// number last, with release), so a reader in another process sees whole entries or skips them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp::flight {

/// Environment variable by which ddp-launch passes the ring's memfd to each worker.
inline constexpr const char* kFdEnv = "DDP_FLIGHT_RECORDER_FD";
inline constexpr uint32_t kMagic = 0x52464444;  // "DDFR"
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kDefaultCapacity = 256;

enum class State : uint32_t { kEmpty = 0, kRunning = 1, kDone = 2, kTimedOut = 3, kFailed = 4 };
const char* stateName(State state);

struct Entry {
  std::atomic<uint64_t> seq;      // the group's sequence number (1-based); 0 while being written
  std::atomic<uint32_t> state;    // State
  int32_t group;                  // 0: the world group; k: the k-th sub-group (newGroup)
  int64_t startNs;                // CLOCK_MONOTONIC, comparable across the node's processes
  std::atomic<int64_t> endNs;     // 0 while not done
  int64_t numel;                  // elements (summed over a list of tensors), -1 when none
  int32_t peer;                   // broadcast root, send/recv peer; -1 otherwise
  char op[20];                    // "all_reduce", "broadcast", "barrier", ...
  char dtype[12];                 // "float", "bfloat16", "" when none
  char label[56];                 // who asked: "DDP gradients", "saveModel", ...
};
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free,
              "the ring is shared between processes: its atomics must be lock-free");

struct Header {
  uint32_t magic;
  uint32_t version;
  uint32_t capacity;
  int32_t rank;           // -1 until the rank's group exists
  int32_t worldSize;
  int32_t pid;
  int64_t timeoutMs;      // the group's collective timeout
  std::atomic<uint64_t> writes;  // entries written so far; entry i lives at i % capacity
  char backend[16];
  char reportDir[512];    // where the launcher writes hang_report.json ("" = nowhere)
};

/// Bytes of a ring of `capacity` entries.
size_t ringBytes(uint32_t capacity);
/// Formats a fresh ring in `memory` (ringBytes(capacity) bytes, zeroed).
void formatRing(void* memory, uint32_t capacity);

/// CLOCK_MONOTONIC in nanoseconds.
int64_t nowNs();

/// The rank's side: a process-wide ring, the launcher's memfd when DDP_FLIGHT_RECORDER_FD names
/// one (checked: size and magic), anonymous memory otherwise. Thread-safe writers.
class Recorder {
 public:
  static Recorder& instance();

  /// Records the start of a collective; returns its entry for end(). Never throws.
  Entry* begin(int group, uint64_t seq, const char* op, const char* label, const char* dtype, int64_t numel, int peer);
  /// Marks the entry's collective ended in `state`, unless the ring has since reused the entry.
  static void end(Entry* entry, uint64_t seq, State state);

  void describeRank(int rank, int worldSize, const std::string& backend, int64_t timeoutMs);
  void setReportDir(const std::string& dir);
  /// Whether the ring is the launcher's (shared) memory.
  bool shared() const { return shared_; }
  Header* header() const { return header_; }

 private:
  Recorder();
  Header* header_ = nullptr;
  Entry* entries_ = nullptr;
  bool shared_ = false;
};

/// One entry as a reader sees it.
struct Record {
  uint64_t seq = 0;
  int group = 0;
  State state = State::kEmpty;
  int64_t startNs = 0;
  int64_t endNs = 0;
  int64_t numel = -1;
  int peer = -1;
  std::string op;
  std::string dtype;
  std::string label;
};

/// A copy of one rank's ring, oldest entry first.
struct Snapshot {
  bool valid = false;  // the memory holds a ring (magic and version) and the rank described itself
  int rank = -1;
  int worldSize = 0;
  int pid = 0;
  int64_t timeoutMs = 0;
  std::string backend;
  std::string reportDir;
  uint64_t writes = 0;  // entries ever written (more than records.size() once the ring wrapped)
  std::vector<Record> records;
};

/// Reads a ring another process may be writing (entries being written are skipped).
Snapshot readRing(const void* memory, size_t bytes);

}  // namespace ddp::flight
