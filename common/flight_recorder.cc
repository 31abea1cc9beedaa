#include "common/flight_recorder.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ddp::flight {
namespace {

template <size_t N>
void copyText(char (&to)[N], const char* from) {
  size_t i = 0;
  if (from != nullptr) {
    for (; i + 1 < N && from[i] != '\0'; ++i) to[i] = from[i];
  }
  to[i] = '\0';
}

template <size_t N>
std::string textOf(const char (&from)[N]) {
  return std::string(from, strnlen(from, N));
}

Entry* entriesOf(Header* header) { return reinterpret_cast<Entry*>(header + 1); }

}  // namespace

const char* stateName(State state) {
  switch (state) {
    case State::kRunning: return "running";
    case State::kDone: return "done";
    case State::kTimedOut: return "timed out";
    case State::kFailed: return "failed";
    default: return "empty";
  }
}

size_t ringBytes(uint32_t capacity) { return sizeof(Header) + size_t{capacity} * sizeof(Entry); }

void formatRing(void* memory, uint32_t capacity) {
  auto* header = static_cast<Header*>(memory);
  header->magic = kMagic;
  header->version = kVersion;
  header->capacity = capacity;
  header->rank = -1;
  header->pid = static_cast<int32_t>(::getpid());
}

int64_t nowNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

Recorder& Recorder::instance() {
  static Recorder recorder;
  return recorder;
}

Recorder::Recorder() {
  // DDP_FLIGHT_RECORDER=0: record nothing (for measuring what the recorder costs; the hang report
  // then has no collectives to show).
  if (const char* flag = std::getenv("DDP_FLIGHT_RECORDER"); flag != nullptr && std::strcmp(flag, "0") == 0) {
    static Header off{};
    header_ = &off;
    ::unsetenv(kFdEnv);
    return;
  }
  // The launcher's memfd, when it is one: the right size and formatted by the launcher. Anything
  // else (an fd number reused for something else) falls back to private memory.
  if (const char* text = std::getenv(kFdEnv)) {
    char* end = nullptr;
    const long fd = std::strtol(text, &end, 10);
    struct stat st {};
    if (end != text && *end == '\0' && fd >= 0 && ::fstat(static_cast<int>(fd), &st) == 0 &&
        st.st_size >= static_cast<off_t>(sizeof(Header))) {
      void* memory = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED,
                            static_cast<int>(fd), 0);
      if (memory != MAP_FAILED) {
        auto* header = static_cast<Header*>(memory);
        if (header->magic == kMagic && header->version == kVersion && header->capacity > 0 &&
            ringBytes(header->capacity) <= static_cast<size_t>(st.st_size)) {
          header_ = header;
          shared_ = true;
          header_->pid = static_cast<int32_t>(::getpid());
        } else {
          ::munmap(memory, static_cast<size_t>(st.st_size));
        }
      }
      // Programs this rank starts (data-loader helpers, a shell) do not inherit the ring.
      ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
    }
    ::unsetenv(kFdEnv);
  }
  if (header_ == nullptr) {
    void* memory = ::mmap(nullptr, ringBytes(kDefaultCapacity), PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) {
      static Header fallback{};  // one entry's worth is not worth failing a job for: record nothing
      header_ = &fallback;
      return;
    }
    formatRing(memory, kDefaultCapacity);
    header_ = static_cast<Header*>(memory);
  }
  entries_ = entriesOf(header_);
}

Entry* Recorder::begin(int group, uint64_t seq, const char* op, const char* label, const char* dtype, int64_t numel,
                       int peer) {
  if (entries_ == nullptr) return nullptr;
  const uint64_t index = header_->writes.fetch_add(1, std::memory_order_relaxed);
  Entry* entry = &entries_[index % header_->capacity];
  entry->seq.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  entry->group = group;
  entry->startNs = nowNs();
  entry->endNs.store(0, std::memory_order_relaxed);
  entry->numel = numel;
  entry->peer = peer;
  entry->state.store(static_cast<uint32_t>(State::kRunning), std::memory_order_relaxed);
  copyText(entry->op, op);
  copyText(entry->dtype, dtype);
  copyText(entry->label, label);
  entry->seq.store(seq, std::memory_order_release);
  return entry;
}

void Recorder::end(Entry* entry, uint64_t seq, State state) {
  if (entry == nullptr || entry->seq.load(std::memory_order_acquire) != seq) return;
  entry->endNs.store(nowNs(), std::memory_order_relaxed);
  entry->state.store(static_cast<uint32_t>(state), std::memory_order_release);
}

void Recorder::describeRank(int rank, int worldSize, const std::string& backend, int64_t timeoutMs) {
  header_->worldSize = worldSize;
  header_->timeoutMs = timeoutMs;
  copyText(header_->backend, backend.c_str());
  std::atomic_thread_fence(std::memory_order_release);
  header_->rank = rank;
}

void Recorder::setReportDir(const std::string& dir) { copyText(header_->reportDir, dir.c_str()); }

Snapshot readRing(const void* memory, size_t bytes) {
  Snapshot snap;
  if (memory == nullptr || bytes < sizeof(Header)) return snap;
  const auto* header = static_cast<const Header*>(memory);
  if (header->magic != kMagic || header->version != kVersion || header->capacity == 0 ||
      ringBytes(header->capacity) > bytes) {
    return snap;
  }
  snap.rank = header->rank;
  std::atomic_thread_fence(std::memory_order_acquire);
  snap.valid = snap.rank >= 0;
  snap.worldSize = header->worldSize;
  snap.pid = header->pid;
  snap.timeoutMs = header->timeoutMs;
  snap.backend = textOf(header->backend);
  snap.reportDir = textOf(header->reportDir);
  snap.writes = header->writes.load(std::memory_order_acquire);
  const auto* entries = reinterpret_cast<const Entry*>(header + 1);
  const uint64_t count = std::min<uint64_t>(snap.writes, header->capacity);
  for (uint64_t i = snap.writes - count; i < snap.writes; ++i) {
    const Entry& e = entries[i % header->capacity];
    const uint64_t seq = e.seq.load(std::memory_order_acquire);
    if (seq == 0) continue;
    Record r;
    r.seq = seq;
    r.group = e.group;
    r.state = static_cast<State>(e.state.load(std::memory_order_acquire));
    r.startNs = e.startNs;
    r.endNs = e.endNs.load(std::memory_order_relaxed);
    r.numel = e.numel;
    r.peer = e.peer;
    r.op = textOf(e.op);
    r.dtype = textOf(e.dtype);
    r.label = textOf(e.label);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (e.seq.load(std::memory_order_relaxed) != seq) continue;  // rewritten while read
    snap.records.push_back(std::move(r));
  }
  return snap;
}

}  // namespace ddp::flight
