#include "comm/shm_communicator.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ATen/ops/from_blob.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <climits>
#include <cstdio>
#include <cstring>
#include <random>

#include "common/error.h"
#include "common/rank_list.h"
#include "common/sha256.h"
#include "common/shm_segment_name.h"

namespace ddp::comm {
namespace {

constexpr size_t kAlign = 64;

size_t alignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

/// Lives at the start of the segment; everything after it is data.
constexpr int kMaxRanks = 1024;

struct Header {
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> generation;  // futex word: bumps when the last rank arrives
  std::atomic<uint32_t> broken;      // a rank timed out: the others fail fast too
  std::atomic<int32_t> pids[kMaxRanks];  // so a waiting rank notices a dead peer at once
  std::atomic<uint32_t> entered[kMaxRanks];  // generation + 1 once the rank arrived: a timeout names who did not
  // What each rank's current collective is, checked by every rank after the collective's first
  // arrival: the shm protocol itself would pair an all-reduce with a barrier, or 999 elements with
  // 1000, without noticing. call = count << 16 | op << 8 | dtype (kWriting while being rewritten).
  std::atomic<uint64_t> call[kMaxRanks];
  std::atomic<uint64_t> callBytes[kMaxRanks];
};
constexpr uint64_t kWriting = ~uint64_t{0};
enum CallOp : uint64_t { kAllReduce = 1, kBroadcast = 2, kBarrier = 3, kAllGather = 4, kReduceScatter = 5 };
// A reduction's call op carries it: kAllReduce | (ReduceOp + 1) << 4, so a max on one rank and a
// sum on another do not pair.
uint64_t allReduceCall(ReduceOp op) { return kAllReduce | (static_cast<uint64_t>(op) + 1) << 4; }
uint64_t reduceScatterCall(ReduceOp op) { return kReduceScatter | (static_cast<uint64_t>(op) + 1) << 4; }
std::string lowerName(at::ScalarType type) {
  std::string out = c10::toString(type);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
std::string opName(uint64_t op) {
  if ((op & 0xf) == kAllReduce || (op & 0xf) == kReduceScatter) {
    const std::string name = (op & 0xf) == kAllReduce ? "all_reduce" : "reduce_scatter";
    const auto reduce = static_cast<ReduceOp>((op >> 4) - 1);
    return reduce == ReduceOp::kSum ? name : name + " (" + reduceOpName(reduce) + ")";
  }
  return op == kBroadcast ? "broadcast" : op == kAllGather ? "all_gather" : "barrier";
}

// out = out (op) other, element-wise.
void reduceInto(at::Tensor& out, const at::Tensor& other, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: out.add_(other); return;
    case ReduceOp::kProduct: out.mul_(other); return;
    case ReduceOp::kMin: at::minimum_out(out, out, other); return;
    case ReduceOp::kMax: at::maximum_out(out, out, other); return;
    case ReduceOp::kAvg: break;
  }
  DDP_THROW(ConfigError, "internal: shm takes kSum, kProduct, kMin or kMax (got ", reduceOpName(op), ")");
}

/// Dead, or a zombie its parent has not reaped yet (kill(pid, 0) still succeeds on those).
bool processGone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  FILE* stat = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (stat == nullptr) return true;
  char state = '?';
  // "pid (comm) S ...": the state follows the last ')'.
  char line[512];
  const size_t n = std::fread(line, 1, sizeof line - 1, stat);
  std::fclose(stat);
  line[n] = '\0';
  if (const char* close = std::strrchr(line, ')'); close != nullptr && close[1] == ' ') state = close[2];
  return state == 'Z' || state == 'X';
}

int futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return static_cast<int>(::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0));
}

class ShmCommunicator;

class ShmCommunicator final : public Communicator {
 public:
  ShmCommunicator(const ShmOptions& options, void* base, size_t bytes)
      : options_(options), base_(static_cast<char*>(base)), bytes_(bytes) {
    header_ = reinterpret_cast<Header*>(base_);
    slots_ = base_ + alignUp(sizeof(Header));
    result_ = slots_ + options_.chunkBytes * static_cast<size_t>(options_.worldSize);
    half_ = options_.chunkBytes / 2 / kAlign * kAlign;
  }
  ~ShmCommunicator() override { ::munmap(base_, bytes_); }

  int rank() const override { return options_.rank; }
  int size() const override { return options_.worldSize; }
  std::string backendName() const override { return "shm"; }

  // Deferred to wait(), on the caller's thread: with every core busy in backward a helper thread
  // would only compete, and a rendezvous inside backward would stall both ranks.
  std::unique_ptr<PendingWork> allReduce(at::Tensor& tensor, const AllReduceOptions& options) override {
    return std::make_unique<DeferredWork>([this, tensor, options]() mutable {
      const TimeoutScope scope(*this, options.timeout);
      allReduceNow(tensor, options.op);
    });
  }

  std::unique_ptr<PendingWork> broadcast(at::Tensor& tensor, const BroadcastOptions& options) override {
    return std::make_unique<DeferredWork>([this, tensor, options]() mutable {
      const TimeoutScope scope(*this, options.timeout);
      broadcastNow(tensor, options.root);
    });
  }

  std::unique_ptr<PendingWork> allGather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                         const CollectiveOptions& options) override {
    outputs.assign(static_cast<size_t>(size()), at::Tensor());
    for (at::Tensor& out : outputs) out = at::empty(input.sizes(), input.options().device(c10::kCPU));
    return std::make_unique<DeferredWork>([this, outputs, input, options]() mutable {
      const TimeoutScope scope(*this, options.timeout);
      allGatherNow(outputs, input);
    });
  }

  std::unique_ptr<PendingWork> reduceScatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                                             const ReduceScatterOptions& options) override {
    if (static_cast<int>(inputs.size()) != size()) {
      DDP_THROW(ConfigError, "shm reduce_scatter: ", inputs.size(), " inputs for ", size(), " ranks; pass one per rank");
    }
    output = at::empty(inputs.front().sizes(), inputs.front().options().device(c10::kCPU));
    return std::make_unique<DeferredWork>([this, output, inputs, options]() mutable {
      const TimeoutScope scope(*this, options.timeout);
      reduceScatterNow(output, inputs, options.op);
    });
  }

  std::unique_ptr<PendingWork> barrier(const CollectiveOptions& options) override {
    return std::make_unique<DeferredWork>([this, options] {
      const TimeoutScope scope(*this, options.timeout);
      barrierNow();
    });
  }

  /// The barrier at start-up (no options yet).
  void barrierNow() { pair(kBarrier, at::kByte, 0, "barrier"); }

 private:
  // The timeout of the collective in progress (0: the group's).
  struct TimeoutScope {
    TimeoutScope(ShmCommunicator& comm, std::chrono::milliseconds timeout) : comm_(comm) {
      comm_.timeout_ = timeout.count() > 0 ? timeout : comm_.options_.timeout;
    }
    ~TimeoutScope() { comm_.timeout_ = comm_.options_.timeout; }
    ShmCommunicator& comm_;
  };

  // Per chunk: copy in, arrive, reduce this rank's share into the result, arrive, copy out. No
  // arrival after the copy-out: only an all-reduce writes the result, after its first arrival,
  // which no rank passes before every rank has copied out.
  void allReduceNow(at::Tensor& tensor, ReduceOp op) {
    at::Tensor work = contiguousCpu(tensor, "all_reduce");
    char* data = static_cast<char*>(work.data_ptr());
    const size_t element = work.element_size();
    const size_t total = static_cast<size_t>(work.numel()) * element;
    const size_t chunkElems = options_.chunkBytes / element;
    const uint64_t call = allReduceCall(op);
    bool paired = fenceSlots(call, work.scalar_type(), total, "all_reduce");
    for (size_t offset = 0; offset < total; offset += chunkElems * element) {
      const size_t bytes = std::min(chunkElems * element, total - offset);
      const int64_t n = static_cast<int64_t>(bytes / element);
      std::memcpy(slot(rank()), data + offset, bytes);
      firstOrNextArrival(paired, call, work.scalar_type(), total, "all_reduce");
      // This rank reduces elements [lo, hi) of the chunk, over every slot in rank order:
      // the same order on every rank, so the result is bitwise identical everywhere.
      const int64_t lo = n * rank() / size();
      const int64_t hi = n * (rank() + 1) / size();
      if (hi > lo) {
        at::Tensor out = at::from_blob(result_ + lo * element, {hi - lo}, work.options());
        reduceSlots(out, [&](int r) { return slot(r) + lo * element; }, op);
      }
      arrive("all_reduce");  // the slots are free again, the result complete
      std::memcpy(data + offset, result_, bytes);
    }
    if (!paired) pair(call, work.scalar_type(), 0, "all_reduce");  // no chunk ran: still one pairing
    if (!work.is_same(tensor)) tensor.copy_(work);
  }

  // Per chunk of half a slot: copy in to this round's half, arrive, copy every rank's out. The
  // halves alternate, so the next chunk's copy-in needs no arrival: the half it overwrites was
  // last read before this round's arrival.
  void allGatherNow(std::vector<at::Tensor>& outputs, const at::Tensor& input) {
    const at::Tensor in = contiguousCpu(input, "all_gather");
    const char* data = static_cast<const char*>(in.data_ptr());
    const size_t element = in.element_size();
    const size_t total = in.nbytes();
    const size_t chunk = half_ / element * element;
    outputs[rank()].copy_(in);
    bool paired = false;
    for (size_t offset = 0; offset < total; offset += chunk) {
      const size_t bytes = std::min(chunk, total - offset);
      const int h = nextHalf();
      std::memcpy(slot(rank(), h), data + offset, bytes);
      firstOrNextArrival(paired, kAllGather, in.scalar_type(), total, "all_gather");
      for (int r = 0; r < size(); ++r) {
        if (r != rank()) std::memcpy(static_cast<char*>(outputs[r].data_ptr()) + offset, slot(r, h), bytes);
      }
      halfInUse_ = h;
    }
    if (!paired) pair(kAllGather, in.scalar_type(), 0, "all_gather");
  }

  // Per chunk: each rank copies elements [offset, offset + n) of every input into its half slot
  // (input q at q * c), arrives, and reduces part rank() of every slot in rank order: the order
  // and the operations of allReduceNow, so the same bits as an all-reduce of the stacked inputs.
  void reduceScatterNow(at::Tensor& output, const std::vector<at::Tensor>& inputs, ReduceOp op) {
    std::vector<at::Tensor> parts;
    for (const at::Tensor& t : inputs) parts.push_back(contiguousCpu(t, "reduce_scatter"));
    const size_t element = output.element_size();
    const int64_t numel = output.numel();
    const size_t total = static_cast<size_t>(numel) * element * static_cast<size_t>(size());
    const int64_t c = static_cast<int64_t>(half_ / (element * static_cast<size_t>(size())));
    const uint64_t call = reduceScatterCall(op);
    bool paired = false;
    for (int64_t offset = 0; offset < numel; offset += c) {
      const int64_t n = std::min(c, numel - offset);
      const int h = nextHalf();
      char* mine = slot(rank(), h);
      for (int q = 0; q < size(); ++q) {
        std::memcpy(mine + q * c * element, static_cast<const char*>(parts[q].data_ptr()) + offset * element,
                    n * element);
      }
      firstOrNextArrival(paired, call, output.scalar_type(), total, "reduce_scatter");
      at::Tensor out = output.view({-1}).narrow(0, offset, n);
      reduceSlots(out, [&](int r) { return slot(r, h) + rank() * c * element; }, op);
      halfInUse_ = h;
    }
    if (!paired) pair(call, output.scalar_type(), 0, "reduce_scatter");
  }

  // out = slot 0's n elements, then (op) each next rank's: in rank order, the same everywhere.
  template <typename SlotData>
  void reduceSlots(at::Tensor& out, SlotData slotData, ReduceOp op) {
    const int64_t n = out.numel();
    out.copy_(at::from_blob(slotData(0), {n}, out.options()));
    for (int r = 1; r < size(); ++r) reduceInto(out, at::from_blob(slotData(r), {n}, out.options()), op);
  }

  void broadcastNow(at::Tensor& tensor, int root) {
    at::Tensor work = contiguousCpu(tensor, "broadcast");
    char* data = static_cast<char*>(work.data_ptr());
    const size_t total = work.nbytes();
    const size_t chunk = options_.chunkBytes * static_cast<size_t>(size());  // the slots, as one buffer
    bool paired = fenceSlots(kBroadcast, work.scalar_type(), total, "broadcast");
    for (size_t offset = 0; offset < total; offset += chunk) {
      const size_t bytes = std::min(chunk, total - offset);
      if (rank() == root) std::memcpy(slots_, data + offset, bytes);
      firstOrNextArrival(paired, kBroadcast, work.scalar_type(), total, "broadcast");
      if (rank() != root) std::memcpy(data + offset, slots_, bytes);
      arrive("broadcast");
    }
    if (!paired) pair(kBroadcast, work.scalar_type(), 0, "broadcast");
    if (!work.is_same(tensor)) tensor.copy_(work);
  }

  char* slot(int r) const { return slots_ + options_.chunkBytes * static_cast<size_t>(r); }
  char* slot(int r, int half) const { return slot(r) + half_ * static_cast<size_t>(half); }
  int nextHalf() const { return halfInUse_ == 0 ? 1 : 0; }

  // A collective's first arrival: announced before it, the pairing checked after it.
  void pair(uint64_t op, at::ScalarType dtype, size_t bytes, const char* name) {
    announce(op, dtype, bytes);
    arrive(name);
    checkPairing(op, dtype, bytes);
  }
  void firstOrNextArrival(bool& paired, uint64_t op, at::ScalarType dtype, size_t bytes, const char* name) {
    if (paired) return arrive(name);
    pair(op, dtype, bytes, name);
    paired = true;
  }
  // Before a collective that writes whole slots: a peer may still be reading the half of the last
  // all-gather or reduce-scatter round; an arrival (the pairing one) waits it out. True if it ran.
  bool fenceSlots(uint64_t op, at::ScalarType dtype, size_t bytes, const char* name) {
    if (halfInUse_ < 0) return false;
    pair(op, dtype, bytes, name);
    return true;
  }

  at::Tensor contiguousCpu(const at::Tensor& t, const char* op) const {
    if (!t.device().is_cpu()) DDP_THROW(ConfigError, "backend 'shm' is for CPU tensors (", op, " got ", t.device().str(), "); use nccl on GPUs");
    return t.is_contiguous() ? t : t.contiguous();
  }

  uint64_t callWord(uint64_t op, at::ScalarType dtype) const {
    return (calls_ << 16) | (op << 8) | static_cast<uint64_t>(static_cast<uint8_t>(dtype));
  }

  void announce(uint64_t op, at::ScalarType dtype, size_t bytes) {
    ++calls_;
    header_->call[rank()].store(kWriting, std::memory_order_release);
    header_->callBytes[rank()].store(bytes, std::memory_order_release);
    header_->call[rank()].store(callWord(op, dtype), std::memory_order_release);
  }

  // After the collective's first arrival every rank has announced it: a rank whose announcement is
  // for this same collective (same count) but another operation, dtype or size does not pair. A
  // rank that has already moved on to its next collective (a larger count) passed this check itself.
  void checkPairing(uint64_t op, at::ScalarType dtype, size_t bytes) {
    const uint64_t mine = callWord(op, dtype);
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      const uint64_t theirs = header_->call[r].load(std::memory_order_acquire);
      const uint64_t theirBytes = header_->callBytes[r].load(std::memory_order_acquire);
      if (theirs == kWriting || header_->call[r].load(std::memory_order_acquire) != theirs) continue;
      if ((theirs >> 16) != calls_) continue;
      if (theirs == mine && theirBytes == bytes) continue;
      header_->broken.store(1);
      futex(&header_->generation, FUTEX_WAKE, INT_MAX, nullptr);
      const auto describe = [](uint64_t word, uint64_t n) {
        const auto type = static_cast<at::ScalarType>(word & 0xff);
        std::string out = opName((word >> 8) & 0xff);
        if (((word >> 8) & 0xff) != kBarrier) {
          out += " of " + std::to_string(n / c10::elementSize(type)) + " " + lowerName(type);
        }
        return out;
      };
      DDP_THROW(CommError, "shm: the ranks' collectives do not pair: rank ", rank(), "'s collective is ",
                describe(mine, bytes), " but rank ", r, "'s is ", describe(theirs, theirBytes),
                ": every rank must run the same collectives in the same order over tensors of the same sizes "
                "and dtypes");
    }
  }

  /// A reusable barrier: spin briefly, then sleep on the generation futex.
  void arrive(const char* op) {
    halfInUse_ = -1;  // what this rank read before arriving, no peer overwrites before it arrives too
    const uint32_t gen = header_->generation.load(std::memory_order_acquire);
    header_->entered[rank()].store(gen + 1, std::memory_order_relaxed);
    if (header_->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(size())) {
      header_->arrived.store(0, std::memory_order_relaxed);
      header_->generation.fetch_add(1, std::memory_order_release);
      futex(&header_->generation, FUTEX_WAKE, INT_MAX, nullptr);
      return;
    }
    constexpr std::chrono::milliseconds kTick{20};
    auto last = std::chrono::steady_clock::now();
    auto deadline = last + timeout_;
    for (int spin = 0; header_->generation.load(std::memory_order_acquire) == gen; ++spin) {
      if (header_->broken.load(std::memory_order_relaxed)) {
        DDP_THROW(CommError, "shm ", op, " failed on rank ", rank(), "/", size(), ": another rank gave up waiting");
      }
      if (spin < 200) {
        sched_yield();
        continue;
      }
      const timespec tick{0, std::chrono::nanoseconds(kTick).count()};
      futex(&header_->generation, FUTEX_WAIT, gen, &tick);
      // Time this rank spent stopped (SIGSTOP, Slurm's scontrol suspend of the whole job, a paused
      // VM) is no peer's silence: a wake-up that came a second or more past its tick moves the
      // deadline on by the gap. (A job suspended for longer than comm.timeout_s failed on resume.)
      const auto now = std::chrono::steady_clock::now();
      if (now - last > kTick + std::chrono::seconds(1)) deadline += now - last - kTick;
      last = now;
      // Same host: a peer that died (crash, OOM kill) is seen within a tick, not at the timeout.
      for (int r = 0; r < size(); ++r) {
        const pid_t pid = header_->pids[r].load(std::memory_order_relaxed);
        if (pid > 0 && pid != ::getpid() && processGone(pid)) {
          header_->broken.store(1);
          futex(&header_->generation, FUTEX_WAKE, INT_MAX, nullptr);
          DDP_THROW(CommError, "shm ", op, " failed on rank ", rank(), "/", size(), ": rank ", r, " (pid ", pid,
                    ") is gone");
        }
      }
      if (now > deadline) {
        header_->broken.store(1);
        futex(&header_->generation, FUTEX_WAKE, INT_MAX, nullptr);
        std::vector<int> absent;
        int joined = 0;
        for (int r = 0; r < size(); ++r) {
          if (header_->entered[r].load(std::memory_order_relaxed) == gen + 1) {
            ++joined;
          } else {
            absent.push_back(r);
          }
        }
        const std::string missing = rankRanges(absent);
        DDP_THROW(TimeoutError, "shm ", op, " on rank ", rank(), "/", size(), " timed out after ",
                  timeout_.count() / 1000.0, " s: ", joined, "/", size(), " ranks joined",
                  missing.empty() ? std::string("; another rank stopped answering or crashed")
                                  : " (missing: " + missing + "); that rank stopped answering or crashed");
      }
    }
  }

  ShmOptions options_;
  char* base_;
  size_t bytes_;
  Header* header_ = nullptr;
  char* slots_ = nullptr;
  char* result_ = nullptr;
  std::chrono::milliseconds timeout_ = options_.timeout;  // the current collective's
  uint64_t calls_ = 0;  // collectives announced: equal on every rank while they pair
  size_t half_ = 0;     // all-gather and reduce-scatter use the slots' halves in turn
  int halfInUse_ = -1;  // the half this rank read after its last arrival (-1: none): peers may still read it
};

}  // namespace

std::unique_ptr<Communicator> makeShmCommunicator(const c10::intrusive_ptr<c10d::Store>& store,
                                                  const ShmOptions& options) {
  if (options.worldSize > kMaxRanks) {
    DDP_THROW(ConfigError, "backend 'shm' supports at most ", kMaxRanks, " ranks per host; use gloo");
  }
  // Half a slot holds one element of every rank's reduce-scatter part (at most 16 bytes each).
  if (options.chunkBytes < 2 * std::max<size_t>(kAlign, 16 * static_cast<size_t>(options.worldSize))) {
    DDP_THROW(ConfigError, "shm: a slot of ", options.chunkBytes, " bytes is too small for ", options.worldSize,
              " ranks; give ShmOptions::chunkBytes at least ", 2 * std::max<size_t>(kAlign, 16 * options.worldSize));
  }
  const size_t bytes = alignUp(sizeof(Header)) + options.chunkBytes * static_cast<size_t>(options.worldSize + 1);
  std::string name;
  // Rank 0 removes the name on every way out of here, errors included; the memory stays
  // until the last unmap. (The launcher removes what a killed rank 0 leaves.)
  struct UnlinkOnExit {
    std::string name;
    ~UnlinkOnExit() {
      if (!name.empty()) ::shm_unlink(name.c_str());
    }
  } unlinkOnExit;
  int fd = -1;
  if (options.rank == 0) {
    // 128 random bits: another user cannot guess the name (and the store only tells the job's ranks).
    name = "/" + shmSegmentPrefix(::getpid()) + crypto::toHex(crypto::randomBytes(16));
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0) unlinkOnExit.name = name;
    // ftruncate never fails on tmpfs: the pages come on first touch, and a /dev/shm too small for
    // them is a SIGBUS in the middle of a collective. posix_fallocate takes them now, or says no.
    int error = 0;
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) error = errno;
    if (error == 0) error = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (error != 0) {
      if (fd >= 0) ::close(fd);
      struct statvfs fs {};
      const std::string room = ::statvfs("/dev/shm", &fs) == 0
                                   ? "; /dev/shm has " + std::to_string((fs.f_bavail * fs.f_frsize) >> 20) + " MiB free"
                                   : std::string();
      DDP_THROW(CommError, "shm: cannot create a ", (bytes + (1u << 20) - 1) >> 20, " MiB segment in /dev/shm (",
                std::strerror(error), room, "); free /dev/shm, enlarge it (docker run --shm-size) or use backend: gloo");
    }
    try {
      store->set("ddp/shm/name", std::vector<uint8_t>(name.begin(), name.end()));
    } catch (...) {
      ::close(fd);
      throw;
    }
  } else {
    const auto value = store->get("ddp/shm/name");  // waits for rank 0, up to the store's timeout
    name.assign(value.begin(), value.end());
    fd = ::shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0) DDP_THROW(CommError, "shm: rank ", options.rank, " cannot open ", name, " (", std::strerror(errno), ")");
    // Map only what rank 0 made: ours, private, and of the size this job needs.
    struct stat info {};
    if (::fstat(fd, &info) != 0 || info.st_uid != ::geteuid() || (info.st_mode & 077) != 0 ||
        static_cast<size_t>(info.st_size) != bytes) {
      ::close(fd);
      DDP_THROW(CommError, "shm: rank ", options.rank, " will not map ", name,
                ": it is not the job's segment (owner, mode or size differ); is another program using the name?");
    }
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) DDP_THROW(CommError, "shm: cannot map ", name, " (", std::strerror(errno), ")");
  // From here the communicator owns (and unmaps) the mapping, also when the start fails.
  static_cast<Header*>(base)->pids[options.rank].store(::getpid());
  auto comm = std::make_unique<ShmCommunicator>(options, base, bytes);
  // Everyone has it mapped: the name can go.
  store->add("ddp/shm/mapped", 1);
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  while (store->add("ddp/shm/mapped", 0) < options.worldSize) {
    if (std::chrono::steady_clock::now() > deadline) {
      DDP_THROW(TimeoutError, "shm: not every rank mapped the segment within ", options.timeout.count() / 1000.0, " s");
    }
    ::usleep(1000);
  }
  comm->barrierNow();
  return comm;
}

}  // namespace ddp::comm
