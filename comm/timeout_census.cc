#include "comm/timeout_census.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/rank_list.h"

namespace ddp::comm {
namespace {

std::string signedKey(int rank) { return "signed/" + std::to_string(rank); }
std::string countedKey(int rank) { return "counted/" + std::to_string(rank); }

struct Shared {
  std::mutex mutex;
  std::condition_variable done;
  bool finished = false;
  std::string answer;
};

}  // namespace

TimeoutCensus::TimeoutCensus(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                             std::chrono::milliseconds window)
    : rank_(rank), size_(size), window_(window) {
  if (store) store_ = c10::make_intrusive<c10d::PrefixStore>("ddp/timeout_census", std::move(store));
}

std::string TimeoutCensus::missingRanks() const {
  if (!store_ || size_ <= 1) return "";
  auto shared = std::make_shared<Shared>();
  // Detached: a store call blocked on a stopped host cannot be interrupted; the thread owns
  // what it touches (the store and the shared state), and the process is about to fail anyway.
  std::thread([shared, store = store_, rank = rank_, size = size_, window = window_] {
    std::string answer;
    try {
      store->set(signedKey(rank), std::vector<uint8_t>{1});
      const auto deadline = std::chrono::steady_clock::now() + window;
      std::vector<int> missing;
      while (true) {
        missing.clear();
        for (int r = 0; r < size; ++r) {
          if (r != rank && !store->check({signedKey(r)})) missing.push_back(r);
        }
        if (missing.empty() || std::chrono::steady_clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (!missing.empty()) answer = "missing: " + rankRanges(missing);
      store->set(countedKey(rank), std::vector<uint8_t>{1});
      // Rank 0 hosts the store: it stays until every rank that signed in has counted too (each
      // within its own window), or those that signed after it would find the store gone.
      if (rank == 0) {
        const auto stayUntil = std::chrono::steady_clock::now() + window + std::chrono::milliseconds(500);
        for (int r = 1; r < size; ++r) {
          while (store->check({signedKey(r)}) && !store->check({countedKey(r)}) &&
                 std::chrono::steady_clock::now() < stayUntil) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
          }
        }
      }
    } catch (const std::exception&) {
      answer = std::string("missing: unknown, ") + kStoreHostGone;
    }
    std::lock_guard<std::mutex> lock(shared->mutex);
    shared->answer = answer;
    shared->finished = true;
    shared->done.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(shared->mutex);
  const auto limit = (rank_ == 0 ? 2 * window_ : window_) + std::chrono::seconds(1);
  if (!shared->done.wait_for(lock, limit, [&] { return shared->finished; })) {
    return std::string("missing: unknown, ") + kStoreHostGone;
  }
  return shared->answer;
}

}  // namespace ddp::comm
