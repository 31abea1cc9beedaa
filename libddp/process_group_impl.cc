// ddp::ProcessGroup::Impl's longer steps: what the store knows of ranks that left through destroy()
// (for a failed collective's error), comm.check_collectives' pairing check, and destroy() itself.
#include "libddp/process_group_impl.h"

#include <c10/core/ScalarType.h>

#include <cctype>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "comm/timeout_census.h"

namespace ddp {

std::string ProcessGroup::Impl::destroyedPeers(const std::string& what) const {
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

const char* ProcessGroup::Impl::dtypeName(at::ScalarType type) {
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

void ProcessGroup::Impl::checkPairing(uint64_t n, const char* op, const char* who, const Shape& shape) {
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

}  // namespace ddp
