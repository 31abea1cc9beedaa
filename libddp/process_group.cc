// ddp::ProcessGroup and initProcessGroup(): the worker's start-up (env contract, device,
// authenticated rendezvous, Gloo/NCCL/shm group) for programs of their own.
#include <c10/core/GradMode.h>
#include <c10/util/Logging.h>
#include <spdlog/spdlog.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <cstdlib>
#include <cctype>
#include <cstring>
#include <memory>
#include <thread>
#include <mutex>
#include <condition_variable>

#include "libddp/flat_tensors.h"
#include "libddp/internal.h"
#include "comm/backend.h"
#include "comm/local_address.h"
#include "comm/process_group.h"
#include "comm/rendezvous.h"
#include "comm/timeout_census.h"
#include "common/error.h"
#include "common/flight_recorder.h"
#include "common/job_token.h"
#include "ddp/ddp.h"
#include "libddp/runtime/device.h"
#include "libddp/runtime/env.h"
#include "libddp/runtime/startup_watchdog.h"

namespace ddp {

// Every collective of a group passes through its Impl on the way to the backend (comm::Communicator):
// after destroy() it refuses with one line (a DDP wrapper or checkpointer that outlived the group's
// communicator would otherwise use freed memory), and it numbers the collectives so that destroy()
// and a failed collective can tell ranks whose collectives did not pair (one rank in an extra
// all-reduce, the other in destroy()).
struct ProcessGroup::Impl final {
  std::unique_ptr<comm::Communicator> owned;  // null when wrapping the worker's communicator
  comm::Communicator* comm = nullptr;
  c10::intrusive_ptr<c10d::Store> store;      // keeps rank 0's store server alive
  c10::Device rankDevice{c10::kCPU};  // where this rank computes
  int localRank = 0;
  int localSize = 1;
  // Kept so that they still answer after destroy().
  int rank_ = 0;
  int size_ = 1;
  std::string backend;
  Backend backendKind = Backend::kLocal;
  c10::Device collectiveDevice{c10::kCPU};
  bool destroyed = false;
  std::string destroyedAt;  // file:line of the destroy() call

  // The last collectives entered: sequence number (1-based), operation, who asked for it.
  struct Entry {
    uint64_t seq = 0;
    const char* op = "";
    std::string label;
  };
  static constexpr size_t kRecent = 8;
  uint64_t seq = 0;
  Entry recent[kRecent];

  void attach(comm::Communicator* c) {
    comm = c;
    rank_ = c->rank();
    size_ = c->size();
    backend = c->backendName();
    backendKind = backend == "local" ? Backend::kLocal : ::ddp::parseBackend(backend).value_or(Backend::kGloo);
    collectiveDevice = c->device();
  }

  comm::Communicator& live(const char* what = "a collective") {
    if (destroyed) {
      DDP_THROW(ConfigError, "ddp::ProcessGroup: ", what, " on rank ", rank_, " after the group was destroyed (",
                "ProcessGroup::destroy() at ", destroyedAt, "); collectives, DDP wrappers and checkpointers ",
                "need a live group: call destroy() once, after the last of them");
    }
    if (comm == nullptr) DDP_THROW(ConfigError, "ddp::ProcessGroup has no communicator; get one from ddp::initProcessGroup()");
    return *comm;
  }

  static std::string describe(const Entry& e) {
    std::string out = std::string(e.op) + " #" + std::to_string(e.seq);
    if (!e.label.empty()) out += " (" + e.label + ")";
    return out;
  }
  const Entry* entry(uint64_t n) const {
    if (n == 0 || n > seq || seq - n >= kRecent) return nullptr;
    return &recent[n % kRecent];
  }
  std::string lastCollective() const {
    const Entry* e = entry(seq);
    return e ? describe(*e) : std::string("none yet");
  }

  // What the store knows about ranks that already left through destroy(): appended to a failed
  // collective's error, since a rank that destroyed while this one was in another collective is the
  // likeliest cause. Never throws, and waits for the store at most a second: its host (rank 0) may
  // be gone or stopped, and the error must not wait for the store's timeout (issue 46 (15)). `what`:
  // the error so far; when its census already found the store's host gone, nothing is asked.
  std::string destroyedPeers(const std::string& what) const {
    if (!store || size_ <= 1 || what.find(comm::kStoreHostGone) != std::string::npos) return "";
    struct Answer {
      std::mutex mutex;
      std::condition_variable done;
      bool finished = false;
      std::string text;
    };
    auto answer = std::make_shared<Answer>();
    // Detached: a store call blocked on a stopped host cannot be interrupted; the thread owns what it touches.
    std::thread([answer, store = store, rank = rank_, size = size_, here = lastCollective()] {
      std::string out;
      try {
        for (int r = 0; r < size; ++r) {
          if (r == rank || !store->check({destroyKey(r)})) continue;
          const auto bytes = store->get(destroyKey(r));
          out += "; rank " + std::to_string(r) + " had called destroy() after its collective " +
                 std::string(bytes.begin(), bytes.end()) + " while this rank was in " + here;
        }
      } catch (const std::exception&) {
        // What was found so far stands.
      }
      std::lock_guard<std::mutex> lock(answer->mutex);
      answer->text = std::move(out);
      answer->finished = true;
      answer->done.notify_all();
    }).detach();
    std::unique_lock<std::mutex> lock(answer->mutex);
    if (!answer->done.wait_for(lock, std::chrono::seconds(1), [&] { return answer->finished; }) ||
        answer->text.empty()) {
      return "";
    }
    return answer->text +
           " — ranks called different collectives: every rank must run the same collectives in the same "
           "order (a step, saveModel(..., group) or an evaluation through the DDP wrapper on some ranks only "
           "breaks this)";
  }

  static std::string destroyKey(int r) { return "ddp/destroy/rank/" + std::to_string(r); }

  // "float", "bfloat16": c10's names in lower case (static strings, built once).
  static const char* dtypeName(at::ScalarType type) {
    static const auto names = [] {
      std::vector<std::string> out;
      for (int i = 0; i < static_cast<int>(at::ScalarType::NumOptions); ++i) {
        std::string name = c10::toString(static_cast<at::ScalarType>(i));
        for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        out.push_back(name);
      }
      return out;
    }();
    const auto i = static_cast<size_t>(type);
    return i < names.size() ? names[i].c_str() : "";
  }
  // What the flight recorder keeps of a collective besides its name.
  struct Shape {
    const char* dtype = "";
    int64_t numel = -1;
    int peer = -1;
  };
  static Shape shapeOf(const at::Tensor& t, int peer = -1) {
    if (!t.defined()) return Shape{"", -1, peer};
    return Shape{dtypeName(t.scalar_type()), t.numel(), peer};
  }
  static Shape shapeOf(const std::vector<at::Tensor>& ts) {
    if (ts.empty()) return Shape{};
    Shape s = shapeOf(ts.front());
    s.numel = 0;
    for (const at::Tensor& t : ts) s.numel += t.defined() ? t.numel() : 0;
    return s;
  }
  int groupIndex = 0;  // 0: the world group; k: the k-th sub-group, in the flight recorder
  // Send and recv involve two ranks, so they are numbered apart from the group's collectives (which
  // every rank runs and numbers alike); in the flight recorder as group kPointToPoint + groupIndex.
  static constexpr int kPointToPoint = 1000000;
  uint64_t p2pSeq = 0;
  // InitOptions::checkCollectives: each collective's signature is compared with rank 0's before it
  // runs (three store operations per collective and rank).
  bool checkCollectives = false;
  std::chrono::milliseconds timeout{0};

  static std::string signatureOf(const char* op, const Shape& shape) {
    std::string out = op;
    if (shape.numel >= 0) out += " of " + std::to_string(shape.numel) + (*shape.dtype ? std::string(" ") + shape.dtype : "");
    if (shape.peer >= 0 && std::strcmp(op, "broadcast") == 0) out += " from root " + std::to_string(shape.peer);
    return out;
  }

  // Before collective `n`: rank 0 publishes its signature, every other rank compares its own with it.
  void checkPairing(uint64_t n, const char* op, const char* who, const Shape& shape) {
    if (!checkCollectives || !store || size_ <= 1) return;
    const std::string key = "ddp/check_collectives/" + std::to_string(n);
    const std::string mine = signatureOf(op, shape);
    const std::string named = mine + (*who ? std::string(" (") + who + ")" : "");
    if (rank_ == 0) {
      store->set(key, std::vector<uint8_t>(named.begin(), named.end()));
      return;
    }
    try {
      store->wait({key}, timeout);
    } catch (const std::exception&) {
      DDP_THROW(TimeoutError, "comm.check_collectives: rank ", rank_, " entered collective #", n, ", ", named,
                ", and rank 0 did not enter its collective #", n, " within ", timeout.count() / 1000.0,
                " s: rank 0 is behind (stopped, hung, or in a long computation of its own)");
    }
    const std::vector<uint8_t> raw = store->get(key);
    const std::string theirs(raw.begin(), raw.end());
    if (store->add(key + "/read", 1) == size_ - 1) {  // the last reader tidies up
      store->deleteKey(key);
      store->deleteKey(key + "/read");
    }
    if (theirs.compare(0, mine.size(), mine) != 0 ||
        (theirs.size() > mine.size() && theirs.compare(mine.size(), 2, " (") != 0)) {
      DDP_THROW(CommError, "collectives do not pair (comm.check_collectives): collective #", n, " is ", named,
                " on rank ", rank_, " but ", theirs, " on rank 0: every rank must run the same collectives in the "
                "same order over tensors of the same sizes (a collective on some ranks only, or a different model "
                "on one rank)");
    }
  }

  // Numbers the collective, records it (entered; done, timed out or failed) and starts it; the
  // returned work's wait() (or destruction) ends the record. `who`: the call's label.
  template <typename Fn>
  std::unique_ptr<comm::PendingWork> start(const char* op, const std::string& who, Shape shape, Fn&& fn, bool p2p = false) {
    comm::Communicator& c = live(op);
    uint64_t n;
    if (p2p) {
      n = ++p2pSeq;
    } else {
      n = ++seq;
      recent[seq % kRecent] = Entry{seq, op, who};
    }
    flight::Entry* entry = flight::Recorder::instance().begin(p2p ? kPointToPoint + groupIndex : groupIndex, n, op,
                                                              who.c_str(), shape.dtype, shape.numel, shape.peer);
    std::unique_ptr<comm::PendingWork> work;
    try {
      if (!p2p) checkPairing(n, op, who.c_str(), shape);
      work = fn(c);
    } catch (...) {
      fail(entry, n);
    }
    return std::make_unique<RecordedWork>(*this, std::move(work), entry, n);
  }

  // Ends the record of a failed collective and rethrows its error with what the store knows of
  // ranks that already left (the likeliest cause).
  [[noreturn]] void fail(flight::Entry* entry, uint64_t n) const {
    try {
      throw;
    } catch (const TimeoutError& e) {
      flight::Recorder::end(entry, n, flight::State::kTimedOut);
      throw TimeoutError(e.what() + destroyedPeers(e.what()));
    } catch (const CommError& e) {
      flight::Recorder::end(entry, n, flight::State::kFailed);
      throw CommError(e.what() + destroyedPeers(e.what()));
    } catch (...) {
      flight::Recorder::end(entry, n, flight::State::kFailed);
      throw;
    }
  }

  // A failed wait() says what a failed start says; the flight recorder's entry ends with the wait.
  class RecordedWork final : public comm::PendingWork {
   public:
    RecordedWork(const Impl& owner, std::unique_ptr<comm::PendingWork> work, flight::Entry* entry, uint64_t seq)
        : owner_(owner), work_(std::move(work)), entry_(entry), seq_(seq) {}
    void wait() {
      if (waited_) return;
      waited_ = true;
      try {
        work_->wait();
      } catch (...) {
        owner_.fail(entry_, seq_);
      }
      flight::Recorder::end(entry_, seq_, flight::State::kDone);
    }

    ~RecordedWork() {
      if (!waited_) {
        work_.reset();  // waits for the collective, as every pending work's destructor does
        flight::Recorder::end(entry_, seq_, flight::State::kDone);
      }
    }

   private:
    const Impl& owner_;
    std::unique_ptr<comm::PendingWork> work_;
    bool waited_ = false;
    flight::Entry* entry_;
    uint64_t seq_;
  };

  // The names collectives have in reports: "all_reduce" (a sum), "all_reduce (max)", ...
  static const char* allReduceName(ReduceOp op) {
    static const char* const names[] = {"all_reduce", "all_reduce (avg)", "all_reduce (product)", "all_reduce (min)",
                                        "all_reduce (max)"};
    return names[static_cast<size_t>(op)];
  }
  static const char* reduceScatterName(ReduceOp op) {
    static const char* const names[] = {"reduce_scatter", "reduce_scatter (avg)", "reduce_scatter (product)",
                                        "reduce_scatter (min)", "reduce_scatter (max)"};
    return names[static_cast<size_t>(op)];
  }

  // kAvg, which backends do not take: a sum, then a division by the group's size (as the
  // reducer's pre-division, the same bits on every rank).
  template <typename Options>
  static Options asSum(const Options& options, const at::Tensor& tensor, const char* what) {
    Options sum = options;
    if (options.op != ReduceOp::kAvg) return sum;
    if (!at::isFloatingType(tensor.scalar_type())) {
      DDP_THROW(ConfigError, "ddp::ProcessGroup::", what, ": ReduceOp::kAvg needs a floating-point tensor (got ",
                tensor.scalar_type(), "); use kSum and divide");
    }
    sum.op = ReduceOp::kSum;
    return sum;
  }
  // `result()` gives the reduced tensor once the sum is in. A template: the sums of the DDP hot path
  // build no std::function.
  template <typename Result>
  std::unique_ptr<comm::PendingWork> thenAverage(std::unique_ptr<comm::PendingWork> work, ReduceOp op,
                                                 Result result) const {
    if (op != ReduceOp::kAvg || size_ == 1) return work;
    return std::make_unique<comm::ThenWork>(std::move(work), [result, n = size_] { result().div_(n); });
  }

  // The collectives as the public methods start them, with their options already labelled.
  int rank() const { return rank_; }
  int size() const { return size_; }
  c10::Device device() const { return collectiveDevice; }
  std::unique_ptr<comm::PendingWork> allReduce(at::Tensor& tensor, const AllReduceOptions& options) {
    const AllReduceOptions sum = asSum(options, tensor, "allReduce");
    auto work = start(allReduceName(options.op), options.label, shapeOf(tensor),
                      [&](comm::Communicator& c) { return c.allReduce(tensor, sum); });
    return thenAverage(std::move(work), options.op, [tensor] { return tensor; });
  }
  std::unique_ptr<comm::PendingWork> broadcast(at::Tensor& tensor, const BroadcastOptions& options) {
    return start("broadcast", options.label, shapeOf(tensor, options.root),
                 [&](comm::Communicator& c) { return c.broadcast(tensor, options); });
  }
  std::unique_ptr<comm::PendingWork> barrier(const CollectiveOptions& options) {
    return start("barrier", options.label, Shape{}, [&](comm::Communicator& c) { return c.barrier(options); });
  }
  void awaitCompletion() {
    comm::Communicator& c = live("waitForCollectives()");
    try {
      c.awaitCompletion();
    } catch (const TimeoutError& e) {
      throw TimeoutError(e.what() + destroyedPeers(e.what()));
    } catch (const CommError& e) {
      throw CommError(e.what() + destroyedPeers(e.what()));
    }
  }
  std::unique_ptr<comm::PendingWork> allGather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                               const CollectiveOptions& options) {
    return start("all_gather", options.label, shapeOf(input),
                 [&](comm::Communicator& c) { return c.allGather(outputs, input, options); });
  }
  std::unique_ptr<comm::PendingWork> reduceScatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                                                   const ReduceScatterOptions& options) {
    const ReduceScatterOptions sum = asSum(options, inputs.front(), "reduceScatter");
    auto work = start(reduceScatterName(options.op), options.label, shapeOf(inputs),
                      [&](comm::Communicator& c) { return c.reduceScatter(output, inputs, sum); });
    return thenAverage(std::move(work), options.op, [&output] { return output; });
  }
  std::unique_ptr<comm::PendingWork> allToAll(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                                              const CollectiveOptions& options) {
    return start("all_to_all", options.label, shapeOf(inputs),
                 [&](comm::Communicator& c) { return c.allToAll(outputs, inputs, options); });
  }
  std::unique_ptr<comm::PendingWork> send(const at::Tensor& tensor, int dst, const CollectiveOptions& options) {
    return start("send", options.label, shapeOf(tensor, dst),
                 [&](comm::Communicator& c) { return c.send(tensor, dst, options); }, /*p2p=*/true);
  }
  std::unique_ptr<comm::PendingWork> recv(at::Tensor& tensor, int src, const CollectiveOptions& options) {
    return start("recv", options.label, shapeOf(tensor, src),
                 [&](comm::Communicator& c) { return c.recv(tensor, src, options); }, /*p2p=*/true);
  }

  // newGroup(): how this group was made, for its sub-groups (absent for a wrapped communicator).
  std::optional<comm::ProcessGroupOptions> groupOptions;
  int subgroups = 0;  // sub-groups made so far: names their store prefix, equal on every rank

  void destroyCollectively(const std::string& where);
};

// Each rank publishes how many collectives it ran before destroy(), meets the others in a barrier,
// and then finds every other rank's number there: a rank whose key is missing met this barrier with
// some other collective (it never called destroy()), a different number means the ranks' sequences
// drifted apart. Then a second barrier, so that rank 0, which serves the store, leaves last. Costs
// two store writes, two store checks and two barriers.
void ProcessGroup::Impl::destroyCollectively(const std::string& where) {
  comm::Communicator& c = live("destroy()");
  const bool check = store && size_ > 1;
  const uint64_t before = seq;
  const std::string mine = lastCollective();
  std::vector<std::string> arrived;  // "rank r reached destroy() after `before` collectives"
  for (int r = 0; r < size_; ++r) arrived.push_back("ddp/destroy/after/" + std::to_string(before) + "/" + std::to_string(r));
  if (check) {
    store->set(destroyKey(rank_), std::vector<uint8_t>(mine.begin(), mine.end()));
    store->set(arrived[rank_], std::vector<uint8_t>{1});
    // c10d's TCPStore::set() sends without waiting for a reply, so without this round trip a rank
    // could pass the barrier and check before the store had read another rank's set() from its
    // socket, and report a mismatch that is not one (seen under torchrun's agent store, 1 run in 15
    // on a loaded machine). The store answers one connection's requests in order: once this check
    // returns, this rank's keys are in.
    store->check({arrived[rank_]});
  }
  // Who is not in destroy() with this rank, and what the store knows of them. Never throws.
  auto elsewhere = [&]() -> std::string {
    std::string out;
    try {
      for (int r = 0; r < size_; ++r) {
        if (r == rank_ || store->check({arrived[r]})) continue;
        if (!out.empty()) out += "; ";
        if (store->check({destroyKey(r)})) {
          const auto bytes = store->get(destroyKey(r));
          out += "rank " + std::to_string(r) + " called destroy() after its collective " +
                 std::string(bytes.begin(), bytes.end());
        } else {
          out += "rank " + std::to_string(r) + " had not called destroy(): its collective #" + std::to_string(before + 1) +
                 " (a collective outside destroy(): an all_reduce, broadcast, barrier, send or recv, ...) met destroy()'s barrier";
        }
      }
    } catch (const std::exception&) {
    }
    return out;
  };
  const std::string advice =
      ". Every rank must run the same collectives in the same order: a step, a saveModel(..., group) or an evaluation "
      "through the DDP wrapper on some ranks only breaks this";
  ++seq;
  recent[seq % kRecent] = Entry{seq, "barrier", "destroy"};
  flight::Entry* first = flight::Recorder::instance().begin(groupIndex, seq, "barrier", "destroy", "", -1, -1);
  try {
    c.barrier()->wait();  // no rank leaves while another may still need rank 0's store
    flight::Recorder::end(first, seq, flight::State::kDone);
  } catch (const CommError& e) {
    flight::Recorder::end(first, seq, dynamic_cast<const TimeoutError*>(&e) ? flight::State::kTimedOut : flight::State::kFailed);
    const std::string others = check ? elsewhere() : "";
    if (others.empty()) throw CommError(std::string("ddp::ProcessGroup::destroy() at ") + where + ": " + e.what());
    throw CommError(std::string("ddp::ProcessGroup::destroy() at ") + where + ": ranks called different collectives: rank " +
                    std::to_string(rank_) + " called destroy() after its collective " + mine + "; " + others + advice +
                    " (" + e.what() + ")");
  }
  if (!check) return;
  if (!store->check(arrived)) {  // one round trip when all is well
    DDP_THROW(CommError, "ddp::ProcessGroup::destroy() at ", where, ": ranks called different collectives: rank ", rank_,
              " called destroy() after its collective ", mine, "; ", elsewhere(), advice);
  }
  // Every rank is in destroy(); a second barrier keeps rank 0 (and its store) until all have checked.
  ++seq;
  recent[seq % kRecent] = Entry{seq, "barrier", "destroy"};
  flight::Entry* second = flight::Recorder::instance().begin(groupIndex, seq, "barrier", "destroy", "", -1, -1);
  try {
    c.barrier()->wait();
    flight::Recorder::end(second, seq, flight::State::kDone);
  } catch (const CommError& e) {
    flight::Recorder::end(second, seq, dynamic_cast<const TimeoutError*>(&e) ? flight::State::kTimedOut : flight::State::kFailed);
    throw CommError(std::string("ddp::ProcessGroup::destroy() at ") + where + ": " + e.what());
  }
}

int GroupStart::rank() const { return impl_->rank; }
int GroupStart::size() const { return impl_->size; }
int GroupStart::localRank() const { return impl_->localRank; }
int GroupStart::localSize() const { return impl_->localSize; }
c10::Device GroupStart::device() const { return impl_->device; }
std::chrono::milliseconds GroupStart::timeout() const { return impl_->timeout; }

ProcessGroup::ProcessGroup(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {
  if (!impl_) {
    DDP_THROW(ConfigError, "ddp::ProcessGroup: no group (a null handle); get one from ddp::initProcessGroup() and "
              "pass it on (copies share the group)");
  }
}
ProcessGroup::Impl& ProcessGroup::impl() const {
  if (!impl_) {
    DDP_THROW(ConfigError, "ddp::ProcessGroup: this handle was moved from; use the handle it was moved to (or a "
              "copy: copies share the group)");
  }
  return *impl_;
}

int ProcessGroup::rank() const { return impl().rank_; }
int ProcessGroup::size() const { return impl().size_; }
int ProcessGroup::localRank() const { return impl().localRank; }
int ProcessGroup::localSize() const { return impl().localSize; }
c10::Device ProcessGroup::device() const { return impl().rankDevice; }
Backend ProcessGroup::backend() const { return impl().backendKind; }
c10::Device ProcessGroup::collectiveDevice() const { return impl().collectiveDevice; }
bool ProcessGroup::destroyed() const { return impl().destroyed; }

namespace {

void checkRank(const ProcessGroup& group, int peer, const char* what) {
  if (peer < 0 || peer >= group.size()) {
    DDP_THROW(ConfigError, "ddp::ProcessGroup::", what, ": rank ", peer, " is not in the group (ranks 0-", group.size() - 1, ")");
  }
}

void checkPeer(const ProcessGroup& group, int peer, const char* what) {
  checkRank(group, peer, what);
  if (peer == group.rank()) DDP_THROW(ConfigError, "ddp::ProcessGroup::", what, ": rank ", peer, " is this rank");
}

// size() tensors of one shape and dtype, as reduceScatter and allToAll take them.
void checkParts(const ProcessGroup& group, const std::vector<at::Tensor>& parts, const char* what) {
  if (static_cast<int>(parts.size()) != group.size()) {
    DDP_THROW(ConfigError, "ddp::ProcessGroup::", what, ": ", parts.size(), " tensors for ", group.size(),
              " ranks; pass one per rank");
  }
  for (const at::Tensor& t : parts) {
    if (!t.defined() || t.sizes() != parts.front().sizes() || t.scalar_type() != parts.front().scalar_type()) {
      DDP_THROW(ConfigError, "ddp::ProcessGroup::", what, ": the tensors must have one shape and dtype (",
                parts.front().sizes(), " ", parts.front().scalar_type(), " vs ", t.sizes(), ")");
    }
  }
}

std::vector<at::Tensor> onDevice(const std::vector<at::Tensor>& tensors, c10::Device device) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const at::Tensor& t : tensors) out.push_back(t.to(device).contiguous());
  return out;
}

}  // namespace

struct Work::Impl {
  // Destroyed in reverse: an unwaited collective finishes before `next` lets go of its tensor.
  std::function<void()> next;               // runs once the below are done
  std::unique_ptr<Impl> first;              // Work::then: what runs before
  std::unique_ptr<comm::PendingWork> work;  // a collective in flight
  void wait() {
    if (auto before = std::move(first)) before->wait();
    if (auto pending = std::move(work)) pending->wait();
    if (auto after = std::move(next)) after();
  }
};

Work::Work() = default;
Work::Work(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Work::~Work() = default;  // a pending collective's own destructor waits for it
Work::Work(Work&&) noexcept = default;
Work& Work::operator=(Work&&) noexcept = default;

void Work::wait() {
  if (auto impl = std::move(impl_)) impl->wait();
}

Work Work::then(Work first, std::function<void()> next) {
  auto impl = std::make_unique<Impl>();
  impl->first = std::move(first.impl_);
  impl->next = std::move(next);
  return Work(std::move(impl));
}

namespace {

Work workOf(std::unique_ptr<comm::PendingWork> pending, std::function<void()> next = {}) {
  auto work = std::make_unique<Work::Impl>();
  work->work = std::move(pending);
  work->next = std::move(next);
  return Work(std::move(work));
}

// Whether the backend takes `tensor` as it is: dense on its collective device; anywhere for a group of
// one (nothing moves); a CUDA tensor for Gloo's all_reduce and broadcast (`glooTakesCuda`), which
// ProcessGroupGloo runs from the GPU itself, so the DDP reducer's buckets of ranks that share a GPU
// over Gloo stay there and overlap backward as before (no host copy inside an autograd hook).
bool takesAsIs(const ProcessGroup::Impl& group, const at::Tensor& tensor, bool glooTakesCuda) {
  if (!tensor.is_contiguous()) return false;
  if (tensor.device() == group.device() || group.backendKind == Backend::kLocal) return true;
  return glooTakesCuda && tensor.is_cuda() && group.backendKind == Backend::kGloo;
}

// Starts `start` on `tensor` where the backend takes it; copies back by wait() when it had to move.
template <typename Start>
Work onCollectiveDevice(const ProcessGroup::Impl& group, at::Tensor& tensor, bool glooTakesCuda, Start start) {
  if (takesAsIs(group, tensor, glooTakesCuda)) return workOf(start(tensor));
  auto moved = std::make_shared<at::Tensor>(tensor.to(group.device()).contiguous());
  auto pending = start(*moved);
  return workOf(std::move(pending), [target = tensor, moved]() mutable { target.copy_(*moved); });
}

}  // namespace

// A call's own label, else the handle's (withLabel()).
template <typename Options>
Options ProcessGroup::labelled(const Options& options) const {
  Options out = options;
  if (out.label.empty()) out.label = label_;
  return out;
}

ProcessGroup ProcessGroup::withLabel(std::string label) const {
  impl();  // a moved-from handle says so
  ProcessGroup out(impl_);
  out.label_ = std::move(label);
  return out;
}

Work ProcessGroup::allReduceAsync(at::Tensor& tensor, const AllReduceOptions& options) {
  Impl& group = impl();
  group.live("all_reduce");
  return onCollectiveDevice(group, tensor, /*glooTakesCuda=*/true,
                            [&, o = labelled(options)](at::Tensor& t) { return group.allReduce(t, o); });
}

void ProcessGroup::allReduce(at::Tensor& tensor, const AllReduceOptions& options) {
  allReduceAsync(tensor, options).wait();
}

Work ProcessGroup::allGatherAsync(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                  const CollectiveOptions& options) {
  Impl& group = impl();
  group.live("all_gather");
  auto staged = std::make_shared<std::vector<at::Tensor>>();
  auto pending = group.allGather(*staged, input.to(group.device()).contiguous(), labelled(options));
  outputs.assign(static_cast<size_t>(size()), at::Tensor());
  return workOf(std::move(pending), [&outputs, staged, device = input.device()] {
    for (size_t r = 0; r < staged->size(); ++r) outputs[r] = (*staged)[r].to(device);
  });
}

std::vector<at::Tensor> ProcessGroup::allGather(const at::Tensor& input, const CollectiveOptions& options) {
  std::vector<at::Tensor> out;
  allGatherAsync(out, input, options).wait();
  return out;
}

Work ProcessGroup::reduceScatterAsync(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                                      const ReduceScatterOptions& options) {
  Impl& group = impl();
  group.live("reduce_scatter");
  checkParts(*this, inputs, "reduceScatter");
  auto staged = std::make_shared<at::Tensor>();
  auto pending = group.reduceScatter(*staged, onDevice(inputs, group.device()), labelled(options));
  return workOf(std::move(pending), [&output, staged, device = inputs.front().device()] { output = staged->to(device); });
}

at::Tensor ProcessGroup::reduceScatter(const std::vector<at::Tensor>& inputs, const ReduceScatterOptions& options) {
  at::Tensor out;
  reduceScatterAsync(out, inputs, options).wait();
  return out;
}

Work ProcessGroup::allToAllAsync(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                                 const CollectiveOptions& options) {
  Impl& group = impl();
  group.live("all_to_all");
  checkParts(*this, inputs, "allToAll");
  auto staged = std::make_shared<std::vector<at::Tensor>>();
  auto pending = group.allToAll(*staged, onDevice(inputs, group.device()), labelled(options));
  outputs.assign(static_cast<size_t>(size()), at::Tensor());
  return workOf(std::move(pending), [&outputs, staged, device = inputs.front().device()] {
    for (size_t r = 0; r < staged->size(); ++r) outputs[r] = (*staged)[r].to(device);
  });
}

std::vector<at::Tensor> ProcessGroup::allToAll(const std::vector<at::Tensor>& inputs, const CollectiveOptions& options) {
  std::vector<at::Tensor> out;
  allToAllAsync(out, inputs, options).wait();
  return out;
}

Work ProcessGroup::sendAsync(const at::Tensor& tensor, int dst, const CollectiveOptions& options) {
  Impl& group = impl();
  group.live("send");
  checkPeer(*this, dst, "send");
  auto moved = std::make_shared<at::Tensor>(tensor.to(group.device()).contiguous());
  auto pending = group.send(*moved, dst, labelled(options));
  return workOf(std::move(pending), [moved] {});  // `moved` lives until the send is done
}

void ProcessGroup::send(const at::Tensor& tensor, int dst, const CollectiveOptions& options) {
  sendAsync(tensor, dst, options).wait();
}

Work ProcessGroup::recvAsync(at::Tensor& tensor, int src, const CollectiveOptions& options) {
  Impl& group = impl();
  group.live("recv");
  checkPeer(*this, src, "recv");
  return onCollectiveDevice(group, tensor, /*glooTakesCuda=*/false,
                            [&, o = labelled(options)](at::Tensor& t) { return group.recv(t, src, o); });
}

void ProcessGroup::recv(at::Tensor& tensor, int src, const CollectiveOptions& options) {
  recvAsync(tensor, src, options).wait();
}

Work ProcessGroup::broadcastAsync(at::Tensor& tensor, const BroadcastOptions& options) {
  Impl& group = impl();
  group.live("broadcast");
  checkRank(*this, options.root, "broadcast");
  return onCollectiveDevice(group, tensor, /*glooTakesCuda=*/true,
                            [&, o = labelled(options)](at::Tensor& t) { return group.broadcast(t, o); });
}

void ProcessGroup::broadcast(at::Tensor& tensor, const BroadcastOptions& options) {
  broadcastAsync(tensor, options).wait();
}

void ProcessGroup::broadcast(const std::vector<at::Tensor>& tensors, const BroadcastOptions& options) {
  Impl& group = impl();
  group.live("broadcast");
  checkRank(*this, options.root, "broadcast");
  if (size() == 1 || tensors.empty()) return;
  c10::NoGradGuard noGrad;
  at::Tensor buffer = flat::flatten(tensors);
  broadcast(buffer, options);
  flat::unflatten(buffer, tensors);
}

Work ProcessGroup::barrierAsync(const CollectiveOptions& options) { return workOf(impl().barrier(labelled(options))); }

void ProcessGroup::barrier(const CollectiveOptions& options) { barrierAsync(options).wait(); }


std::optional<ProcessGroup> ProcessGroup::newGroup(const std::vector<int>& ranks) {
  Impl& world = impl();
  world.live("newGroup");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.empty() || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() || sorted.front() < 0 ||
      sorted.back() >= world.size()) {
    DDP_THROW(ConfigError, "ddp::ProcessGroup::newGroup: the ranks must be distinct members of this group (0-",
              world.size() - 1, "), at least one");
  }
  const int index = world.subgroups++;  // every rank calls newGroup in the same order, as new_group
  if (world.store) {
    // Every rank must name the same ranks (new_group's rule): the first to come records its list;
    // a rank with another list stops here at once, not at the end of the group's timeout.
    std::string list;
    for (int r : sorted) list += (list.empty() ? "" : ",") + std::to_string(r);
    const std::vector<uint8_t> want(list.begin(), list.end());
    const std::vector<uint8_t> got =
        world.store->compareSet("ddp/subgroup_ranks/" + std::to_string(index), std::vector<uint8_t>(), want);
    if (got != want) {
      DDP_THROW(ConfigError, "ddp::ProcessGroup::newGroup (call ", index + 1, "): rank ", world.rank(), " names ranks [",
                list, "] but another rank named [", std::string(got.begin(), got.end()), "]: every rank must call ",
                "newGroup with the same ranks, its calls in the same order");
    }
  }
  const auto mine = std::find(sorted.begin(), sorted.end(), world.rank());
  if (mine == sorted.end()) return std::nullopt;
  auto impl = std::make_shared<Impl>();
  impl->groupIndex = index + 1;
  impl->checkCollectives = world.checkCollectives;
  impl->timeout = world.timeout;
  impl->rankDevice = world.rankDevice;
  impl->localRank = world.localRank;
  impl->localSize = world.localSize;
  if (sorted.size() == 1) {
    impl->owned = std::make_unique<comm::LocalCommunicator>();
  } else {
    if (!world.store || !world.groupOptions) {
      DDP_THROW(ConfigError, "ddp::ProcessGroup::newGroup: this group was not made by ddp::initProcessGroup, so it "
                "has no store to meet at");
    }
    comm::ProcessGroupOptions options = *world.groupOptions;
    options.rank = static_cast<int>(mine - sorted.begin());
    options.worldSize = static_cast<int>(sorted.size());
    impl->store = c10::make_intrusive<c10d::PrefixStore>("ddp/subgroup/" + std::to_string(index), world.store);
    impl->owned = comm::makeCommunicator(impl->store, options);
    impl->groupOptions = options;
  }
  impl->attach(impl->owned.get());
  return ProcessGroup(std::move(impl));
}


void ProcessGroup::waitForCollectives() { impl().awaitCompletion(); }

void ProcessGroup::destroy(const char* file, int line) {
  Impl& s = impl();
  if (s.destroyed) return;
  const std::string where = std::string(file ? file : "?") + ":" + std::to_string(line);
  s.destroyCollectively(where);
  s.destroyed = true;
  s.destroyedAt = where;
  // The communicator goes; the Impl stays with every handle (DDP wrappers, checkpointers), which
  // now get ConfigError from live() instead of a freed communicator.
  s.owned.reset();
  s.comm = nullptr;
  s.store.reset();
}

namespace {

std::vector<uint8_t> bytesOf(const std::string& text) { return {text.begin(), text.end()}; }

// The rank's own error as the others rethrow it: its class (so its exit code) and its first line.
std::string verdictOf(const std::exception& e) {
  const char* kind = dynamic_cast<const ConfigError*>(&e) ? "C"
                     : dynamic_cast<const DataError*>(&e) ? "D"
                     : dynamic_cast<const CheckpointError*>(&e) ? "K" : "E";
  const std::string what = e.what();
  return kind + what.substr(0, what.find('\n'));
}

[[noreturn]] void rethrowVerdict(const std::string& verdict) {
  const std::string what = verdict.substr(1) + " (rank 0's error; this rank stops with it)";
  switch (verdict.front()) {
    case 'C': throw ConfigError(what);
    case 'D': throw DataError(what);
    case 'K': throw CheckpointError(what);
    default: throw Error(what);
  }
}

// InitOptions::beforeGroup on every rank, with rank 0's outcome shared: rank 0 hosts the store, so
// were it to leave at once on its own error (a model too large, a bad data set), a rank still
// talking to the store would fail with "connection closed" (exit 1) instead of the same one line
// (exit 2). Rank 0 publishes its verdict and, on an error, waits (at most 30 s) until every rank has
// come through its own beforeGroup; a rank that succeeded rethrows rank 0's error. Costs one store
// add per rank and one wait on the other ranks, once per job.
void runBeforeGroup(const std::function<void(const GroupStart&)>& beforeGroup, const GroupStart& start,
                    c10d::Store& store, std::chrono::milliseconds timeout) {
  static const std::string kDone = "ddp/before_group/done";
  static const std::string kAll = "ddp/before_group/all";
  static const std::string kVerdict = "ddp/before_group/rank0";
  const auto checkIn = [&] {
    if (store.add(kDone, 1) == start.size()) store.set(kAll, bytesOf("1"));
  };
  try {
    beforeGroup(start);
  } catch (const std::exception& e) {
    try {
      if (start.rank() == 0) store.set(kVerdict, bytesOf(verdictOf(e)));
      checkIn();
      if (start.rank() == 0) store.wait({kAll}, std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(30)));
    } catch (const std::exception&) {
      // A rank that never comes cannot be helped: this rank's own error is what matters.
    }
    throw;
  }
  if (start.rank() == 0) {
    store.set(kVerdict, bytesOf("+"));
    checkIn();
    return;
  }
  // Read rank 0's verdict before checking in: a failed rank 0 leaves (and its store with it) as soon
  // as every rank has checked in.
  store.wait({kVerdict}, timeout);
  const std::vector<uint8_t> raw = store.get(kVerdict);
  const std::string verdict(raw.begin(), raw.end());
  checkIn();
  if (!verdict.empty() && verdict != "+") rethrowVerdict(verdict);
}

}  // namespace

namespace {

// The group initProcessGroup() made, for ddp::rank() and ddp::worldSize(); -1 until then.
std::atomic<int> worldRank{-1};
std::atomic<int> worldRanks{-1};

ProcessGroup madeByInit(std::shared_ptr<ProcessGroup::Impl> impl) {
  worldRanks = impl->size_;
  worldRank = impl->rank_;
  return ProcessGroup(std::move(impl));
}

int worldValue(const std::atomic<int>& value, const char* what) {
  const int v = value.load();
  if (v < 0) {
    DDP_THROW(ConfigError, "ddp::", what, "() before ddp::initProcessGroup(): call initProcessGroup() first (as "
              "torch.distributed's get_rank needs init_process_group)");
  }
  return v;
}

}  // namespace

int rank() { return worldValue(worldRank, "rank"); }
int worldSize() { return worldValue(worldRanks, "worldSize"); }
bool isInitialized() { return worldRank.load() >= 0; }

ProcessGroup initProcessGroup(const InitOptions& options) {
  using namespace ddp::runtime;
  // The env contract describes one group: a second rendezvous at the same MASTER_PORT would meet
  // nobody (the launcher's listening socket is taken, the other ranks have moved on).
  static std::atomic<bool> initialised{false};
  if (initialised.exchange(true)) {
    DDP_THROW(ConfigError, "ddp::initProcessGroup() was called twice in this process; call it once and pass the "
              "ProcessGroup on (copies share the group)");
  }
  // LibTorch's own log lines (c10d's socket retries with stack traces) would bury our one-line
  // errors; only FATAL passes unless the user asks for more (TORCH_CPP_LOG_LEVEL).
  ::setenv("TORCH_CPP_LOG_LEVEL", "FATAL", /*overwrite=*/0);
  c10::initLogging();
  const DistEnv env = readDistEnv(processEnv(), options.legacyLocalRank);
  // The secret stays in this process: programs it starts do not get it, and /proc/PID/environ (the
  // initial environment block, which unsetenv leaves as it was) shows only x's where it was.
  if (char* token = ::getenv(kTokenEnv)) std::memset(token, 'x', std::strlen(token));
  ::unsetenv(kTokenEnv);
  ::unsetenv(kStoreFdEnv);
  // A peer that dies while this rank writes to it (Gloo's sockets, the store's) would end this rank
  // by SIGPIPE, without a line and blamed for the failure; ignored, the write fails with EPIPE and
  // the collective names the peer. Only where the program kept the default.
  struct sigaction onPipe {};
  if (::sigaction(SIGPIPE, nullptr, &onPipe) == 0 && onPipe.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
  if (options.timeout.count() <= 0) DDP_THROW(ConfigError, "ddp::InitOptions::timeout must be positive");
  auto impl = std::make_shared<ProcessGroup::Impl>();
  flight::Recorder& recorder = flight::Recorder::instance();  // takes the launcher's ring (and its env) now
  if (!options.hangReportDir.empty()) recorder.setReportDir(options.hangReportDir);
  impl->checkCollectives = options.checkCollectives;
  impl->timeout = options.timeout;
  const auto describe = [&](const ProcessGroup::Impl& group) {
    recorder.describeRank(env.rank, env.worldSize, group.backend, options.timeout.count());
  };

  impl->localRank = env.localRank;
  impl->localSize = env.localWorldSize;
  const comm::Backend requested = options.backend;
  if (requested == Backend::kLocal) {
    DDP_THROW(ConfigError, "ddp::InitOptions::backend is kLocal, which a group of one reports; ask for kAuto, kGloo, "
              "kNccl or kShm");
  }
  DeviceRequest request;
  request.requested = options.device;
  request.localRank = env.localRank;
  request.localWorldSize = env.localWorldSize;
  request.ranksMayShareGpu = requested == comm::Backend::kGloo;
  impl->rankDevice = selectDevice(request);
  useDevice(impl->rankDevice);  // before any CUDA work: no rank opens a context on GPU 0
  const comm::Backend backend =
      comm::resolveBackend(requested, impl->rankDevice.is_cuda(), /*singleHost=*/env.localWorldSize == env.worldSize);
  GroupStart::Impl start;
  start.rank = env.rank;
  start.size = env.worldSize;
  start.localRank = env.localRank;
  start.localSize = env.localWorldSize;
  start.device = impl->rankDevice;
  start.timeout = options.timeout;
  // backend: nccl gets a real NCCL group even for one rank (as init_process_group does); the others
  // take the network-free path.
  const bool groupForSingleRank = requested == comm::Backend::kNccl;
  if (env.worldSize == 1 && !groupForSingleRank) {
    if (options.beforeGroup) options.beforeGroup(GroupStart(start));
    impl->owned = std::make_unique<comm::LocalCommunicator>();
    impl->attach(impl->owned.get());
    describe(*impl);
    return madeByInit(std::move(impl));
  }

  const comm::RendezvousOptions rdv = internal::rendezvousOptions(env, options.timeout, options.timeoutName);
  impl->store = internal::meetAtStore(rdv);
  start.store = impl->store;
  if (options.beforeGroup) runBeforeGroup(options.beforeGroup, GroupStart(start), *impl->store, options.timeout);
  const comm::ProcessGroupOptions pg =
      internal::groupOptions(env, backend, impl->rankDevice, options.timeout, groupForSingleRank);
  impl->owned = internal::createGroup(impl->store, pg, rdv);
  impl->attach(impl->owned.get());
  impl->groupOptions = pg;
  describe(*impl);
  return madeByInit(std::move(impl));
}

namespace internal {

ProcessGroup wrapCommunicator(comm::Communicator& comm, c10::Device device, int localRank, int localSize) {
  auto impl = std::make_shared<ProcessGroup::Impl>();
  impl->attach(&comm);
  impl->rankDevice = device;
  impl->localRank = localRank;
  impl->localSize = localSize;
  return ProcessGroup(std::move(impl));
}

void checkLive(const ProcessGroup& group, const char* what) { group.impl().live(what); }

comm::RendezvousOptions rendezvousOptions(const runtime::DistEnv& env, std::chrono::milliseconds timeout,
                                          const std::string& timeoutName) {
  comm::RendezvousOptions rdv;
  rdv.timeoutName = timeoutName;
  rdv.masterAddr = env.masterAddr;
  rdv.masterPort = static_cast<std::uint16_t>(env.masterPort);
  rdv.rank = env.rank;
  rdv.worldSize = env.worldSize;
  rdv.timeout = timeout;
  // torchrun's static rendezvous: its agent hosts the store at MASTER_ADDR:PORT and keeps it
  // across restarts, so each attempt keeps its keys apart.
  rdv.storeServedElsewhere = env.agentStore;
  rdv.attempt = env.restartCount;
  rdv.token = env.token;
  rdv.listenFd = env.storeFd;
  rdv.bindAddr = env.rdzvBind;
  if (env.rank == 0 && !env.agentStore && env.token.empty()) {
    spdlog::warn("the job's store at {}:{} admits any client that reaches it: no {} or {} is set (ddp-launch "
                 "sets one; see docs/security.md)",
                 env.rdzvBind.empty() ? env.masterAddr : env.rdzvBind, env.masterPort, kTokenEnv, kTokenFileEnv);
  }
  return rdv;
}

// Each start-up phase honours the timeout even where LibTorch's store client would block past it;
// the grace lets the phase's own, more precise error come first.
std::chrono::milliseconds phaseLimit(const comm::RendezvousOptions& rdv) { return rdv.timeout + std::chrono::seconds(5); }

c10::intrusive_ptr<c10d::Store> meetAtStore(const comm::RendezvousOptions& rdv) {
  runtime::StartupWatchdog watchdog(phaseLimit(rdv), [&rdv] { return comm::unansweredStoreMessage(rdv); });
  return comm::rendezvous(rdv);
}

comm::ProcessGroupOptions groupOptions(const runtime::DistEnv& env, comm::Backend backend, c10::Device device,
                                       std::chrono::milliseconds timeout, bool groupForSingleRank) {
  comm::ProcessGroupOptions pg;
  pg.backend = backend;
  pg.rank = env.rank;
  pg.worldSize = env.worldSize;
  pg.timeout = timeout;
  pg.device = device;
  pg.groupForSingleRank = groupForSingleRank;
  // Single node: loopback. Multi-node: the local address that routes to MASTER_ADDR
  // (GLOO_SOCKET_IFNAME overrides both).
  pg.hostname = env.localWorldSize == env.worldSize ? "127.0.0.1" : comm::localAddressFor(env.masterAddr);
  return pg;
}

std::unique_ptr<comm::Communicator> createGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                const comm::ProcessGroupOptions& pg,
                                                const comm::RendezvousOptions& rdv) {
  runtime::StartupWatchdog watchdog(phaseLimit(rdv), [&rdv, &pg] {
    return "start-up: rank " + std::to_string(rdv.rank) + " could not create its " + backendName(pg.backend) +
           " process group within " + rdv.timeoutName + "=" +
           ::ddp::detail::concat(static_cast<double>(rdv.timeout.count()) / 1000.0) + " s (the store at " +
           rdv.masterAddr + ":" + std::to_string(rdv.masterPort) + " stopped answering); did another rank fail?";
  });
  auto group = comm::makeCommunicator(store, pg);
  watchdog.disarm();
  return group;
}

}  // namespace internal
}  // namespace ddp
