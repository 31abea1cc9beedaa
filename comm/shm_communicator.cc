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
enum CallOp : uint64_t { kAllReduce = 1, kBroadcast = 2, kBarrier = 3 };
// An all-reduce's call op carries its reduction: kAllReduce | (ReduceOp + 1) << 4, so a max on one
// rank and a sum on another do not pair.
uint64_t allReduceCall(ReduceOp op) { return kAllReduce | (static_cast<uint64_t>(op) + 1) << 4; }
std::string lowerName(at::ScalarType type) {
  std::string out = c10::toString(type);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
std::string opName(uint64_t op) {
  if ((op & 0xf) == kAllReduce) {
    const auto reduce = static_cast<ReduceOp>((op >> 4) - 1);
    return reduce == ReduceOp::kSum ? "all_reduce" : std::string("all_reduce (") + reduceOpName(reduce) + ")";
  }
  return op == kBroadcast ? "broadcast" : "barrier";
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

  std::unique_ptr<PendingWork> barrier(const CollectiveOptions& options) override {
    return std::make_unique<DeferredWork>([this, options] {
      const TimeoutScope scope(*this, options.timeout);
      barrierNow();
    });
  }

  /// The barrier at start-up (no options yet).
  void barrierNow() {
    announce(kBarrier, at::kByte, 0);
    arrive("barrier");
    checkPairing(kBarrier, at::kByte, 0);
  }

 private:
  // The timeout of the collective in progress (0: the group's).
  struct TimeoutScope {
    TimeoutScope(ShmCommunicator& comm, std::chrono::milliseconds timeout) : comm_(comm) {
      comm_.timeout_ = timeout.count() > 0 ? timeout : comm_.options_.timeout;
    }
    ~TimeoutScope() { comm_.timeout_ = comm_.options_.timeout; }
    ShmCommunicator& comm_;
  };

  void allReduceNow(at::Tensor& tensor, ReduceOp op) {
    at::Tensor work = contiguousCpu(tensor, "all_reduce");
    char* data = static_cast<char*>(work.data_ptr());
    const size_t element = work.element_size();
    const size_t total = static_cast<size_t>(work.numel()) * element;
    const size_t chunkElems = options_.chunkBytes / element;
    for (size_t offset = 0; offset < total; offset += chunkElems * element) {
      const size_t bytes = std::min(chunkElems * element, total - offset);
      const int64_t n = static_cast<int64_t>(bytes / element);
      std::memcpy(slot(rank()), data + offset, bytes);
      if (offset == 0) announce(allReduceCall(op), work.scalar_type(), total);
      arrive("all_reduce");
      if (offset == 0) checkPairing(allReduceCall(op), work.scalar_type(), total);
      // This rank reduces elements [lo, hi) of the chunk, over every slot in rank order:
      // the same order on every rank, so the result is bitwise identical everywhere.
      const int64_t lo = n * rank() / size();
      const int64_t hi = n * (rank() + 1) / size();
      if (hi > lo) {
        const auto opts = at::TensorOptions().dtype(work.scalar_type());
        at::Tensor out = at::from_blob(result_ + lo * element, {hi - lo}, opts);
        out.copy_(at::from_blob(slot(0) + lo * element, {hi - lo}, opts));
        for (int r = 1; r < size(); ++r) reduceInto(out, at::from_blob(slot(r) + lo * element, {hi - lo}, opts), op);
      }
      arrive("all_reduce");
      std::memcpy(data + offset, result_, bytes);
      arrive("all_reduce");  // the slots and the result are reused next
    }
    if (total == 0) {  // no chunk ran: still one pairing
      announce(allReduceCall(op), work.scalar_type(), 0);
      arrive("all_reduce");
      checkPairing(allReduceCall(op), work.scalar_type(), 0);
      arrive("all_reduce");
    }
    if (!work.is_same(tensor)) tensor.copy_(work);
  }

  void broadcastNow(at::Tensor& tensor, int root) {
    at::Tensor work = contiguousCpu(tensor, "broadcast");
    char* data = static_cast<char*>(work.data_ptr());
    const size_t total = work.nbytes();
    const size_t chunk = options_.chunkBytes * static_cast<size_t>(size());  // the slots, as one buffer
    for (size_t offset = 0; offset < total; offset += chunk) {
      const size_t bytes = std::min(chunk, total - offset);
      if (rank() == root) std::memcpy(slots_, data + offset, bytes);
      if (offset == 0) announce(kBroadcast, work.scalar_type(), total);
      arrive("broadcast");
      if (offset == 0) checkPairing(kBroadcast, work.scalar_type(), total);
      if (rank() != root) std::memcpy(data + offset, slots_, bytes);
      arrive("broadcast");
    }
    if (total == 0) {
      announce(kBroadcast, work.scalar_type(), 0);
      arrive("broadcast");
      checkPairing(kBroadcast, work.scalar_type(), 0);
      arrive("broadcast");
    }
    if (!work.is_same(tensor)) tensor.copy_(work);
  }

  char* slot(int r) const { return slots_ + options_.chunkBytes * static_cast<size_t>(r); }

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
                ": every rank must run the same collectives in the same order over tensors of the same sizes");
    }
  }

  /// A reusable barrier: spin briefly, then sleep on the generation futex.
  void arrive(const char* op) {
    const uint32_t gen = header_->generation.load(std::memory_order_acquire);
    header_->entered[rank()].store(gen + 1, std::memory_order_relaxed);
    if (header_->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(size())) {
      header_->arrived.store(0, std::memory_order_relaxed);
      header_->generation.fetch_add(1, std::memory_order_release);
      futex(&header_->generation, FUTEX_WAKE, INT_MAX, nullptr);
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (int spin = 0; header_->generation.load(std::memory_order_acquire) == gen; ++spin) {
      if (header_->broken.load(std::memory_order_relaxed)) {
        DDP_THROW(CommError, "shm ", op, " failed on rank ", rank(), "/", size(), ": another rank gave up waiting");
      }
      if (spin < 200) {
        sched_yield();
        continue;
      }
      const timespec tick{0, 20 * 1000 * 1000};
      futex(&header_->generation, FUTEX_WAIT, gen, &tick);
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
      if (std::chrono::steady_clock::now() > deadline) {
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
};

}  // namespace

std::unique_ptr<Communicator> makeShmCommunicator(const c10::intrusive_ptr<c10d::Store>& store,
                                                  const ShmOptions& options) {
  if (options.worldSize > kMaxRanks) {
    DDP_THROW(ConfigError, "backend 'shm' supports at most ", kMaxRanks, " ranks per host; use gloo");
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
