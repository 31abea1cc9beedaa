#include "worker/dp/replica_threads.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <spdlog/spdlog.h>

namespace ddp::worker::dp {
namespace {

/// LibTorch's native (non-OpenMP) thread pool refuses a second set_num_threads;
/// the replicas then share its pool instead, which is correct, only slower.
void setIntraOpThreads(int n) {
  if (n <= 0) return;
  try {
    at::set_num_threads(n);
  } catch (const std::exception& e) {
    static std::once_flag once;
    std::call_once(once, [&] { spdlog::warn("dp: cannot set intra-op threads per replica: {}", e.what()); });
  }
}

}  // namespace

ReplicaThreads::ReplicaThreads(const ReplicaThreadsOptions& options) {
  // at::set_num_threads sets the calling thread's OpenMP team size but also a
  // process-wide default that threads pick up on their first parallel op. Each
  // replica thread initialises itself first and then drops to intraOpThreads;
  // once all have, the caller's default is put back for everyone else.
  const int callerThreads = at::get_num_threads();
  errors_.resize(static_cast<std::size_t>(options.threads));
  for (int i = 0; i < options.threads; ++i) {
    threads_.emplace_back([this, i, intraOp = options.intraOpThreads] {
      at::get_num_threads();  // lazy per-thread init now, so it cannot undo the next line later
      setIntraOpThreads(intraOp);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++started_;
      }
      done_.notify_all();
      loop(i);
    });
  }
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return started_ == options.threads; });
  if (options.intraOpThreads > 0) setIntraOpThreads(callerThreads);
}

ReplicaThreads::~ReplicaThreads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void ReplicaThreads::run(int count, const std::function<void(int)>& task) {
  if (count <= 0) return;
  if (count > size()) count = size();
  std::lock_guard<std::mutex> turn(runMutex_);
  const at::ThreadLocalState callerState;
  const std::function<void(int)> wrapped = [&](int i) {
    at::ThreadLocalStateGuard guard(callerState);
    task(i);
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task_ = &wrapped;
    count_ = count;
    pending_ = count;
    for (auto& e : errors_) e = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
  task_ = nullptr;
  for (int i = 0; i < count; ++i) {
    if (errors_[static_cast<std::size_t>(i)]) std::rethrow_exception(errors_[static_cast<std::size_t>(i)]);
  }
}

void ReplicaThreads::loop(int index) {
  uint64_t seen = 0;
  while (true) {
    const std::function<void(int)>* task = nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || (generation_ != seen && index < count_); });
      if (stop_) return;
      seen = generation_;
      task = task_;
    }
    std::exception_ptr error;
    try {
      (*task)(index);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      errors_[static_cast<std::size_t>(index)] = error;
      --pending_;
    }
    done_.notify_all();
  }
}

}  // namespace ddp::worker::dp
