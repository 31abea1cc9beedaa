// ddp::ProcessGroup's state (the Impl behind every handle): the communicator, the numbering and
// records of its collectives, the pairing check and destroy(). Shared by process_group.cc (the
// public collectives), init_process_group.cc (the group's making) and process_group_impl.cc. Not
// installed.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/backend.h"
#include "comm/communicator.h"
#include "comm/group_options.h"
#include "common/error.h"
#include "common/flight_recorder.h"
#include "ddp/process_group.h"

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
  std::string destroyedPeers(const std::string& what) const;

  static std::string destroyKey(int r) { return "ddp/destroy/rank/" + std::to_string(r); }

  // "float", "bfloat16": c10's names in lower case (static strings, built once).
  static const char* dtypeName(at::ScalarType type);
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
  void checkPairing(uint64_t n, const char* op, const char* who, const Shape& shape);

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

}  // namespace ddp
