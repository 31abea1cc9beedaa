// A fixed set of threads, one per replica, that run one task each per call:
// the "parallel apply" of DataParallel without creating threads every step.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ddp::worker::dp {

struct ReplicaThreadsOptions {
  int threads = 1;          // one per replica
  int intraOpThreads = 1;   // LibTorch intra-op threads inside each replica thread; 0 = leave the default
};

class ReplicaThreads {
 public:
  explicit ReplicaThreads(const ReplicaThreadsOptions& options);
  ~ReplicaThreads();
  ReplicaThreads(const ReplicaThreads&) = delete;
  ReplicaThreads& operator=(const ReplicaThreads&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }

  /// Runs task(i) on thread i for every i < count, with the caller's thread-local
  /// LibTorch state (grad mode, ...), and returns when all are done. The first
  /// exception (lowest i) is rethrown here. Calls from several threads take turns;
  /// a task must not call run() itself.
  void run(int count, const std::function<void(int)>& task);

 private:
  void loop(int index);

  std::vector<std::thread> threads_;
  std::mutex runMutex_;  // one run() at a time
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int)>* task_ = nullptr;
  uint64_t generation_ = 0;   // bumped by every run()
  int count_ = 0;             // threads [0, count_) take part in this generation
  int pending_ = 0;           // of those, how many are still working
  int started_ = 0;           // threads that finished their start-up
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;
};

}  // namespace ddp::worker::dp
