#include "launcher/elastic_watch.h"

#include "common/error.h"

namespace ddp::launcher::elastic {
namespace {

// How often the watcher of a running round looks at the others.
constexpr std::chrono::milliseconds kWatchInterval{200};

}  // namespace

Heartbeat::Heartbeat(const comm::StoreClientOptions& options, std::string key, std::chrono::milliseconds interval)
    : options_(options), client_(std::make_unique<comm::StoreClient>(options)), key_(std::move(key)),
      interval_(interval), thread_([this] { loop(); }) {}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::optional<std::string> Heartbeat::failure() {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void Heartbeat::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    lock.unlock();
    try {
      beat();
    } catch (const std::exception& e) {
      lock.lock();
      failure_ = e.what();
      return;
    }
    lock.lock();
    wake_.wait_for(lock, interval_, [this] { return stop_; });
  }
}

void Heartbeat::beat() {
  try {
    client_->add(key_, 1);
  } catch (const ddp::Error&) {
    client_ = std::make_unique<comm::StoreClient>(options_);
    client_->add(key_, 1);
  }
}

std::optional<std::string> Liveness::gone(int id) {
  discountOwnGap();
  if (store_.check({keys_.left(id)})) return text(store_.get(keys_.left(id), store_.timeout()));
  const std::int64_t beat = store_.add(keys_.heartbeat(id), 0);
  Seen& seen = seen_[id];
  if (!seen.known || beat != seen.beat) {
    if (seen.known) seen.moved = true;
    seen = {true, beat, Clock::now(), seen.moved};
    return std::nullopt;
  }
  if (secondsSince(seen.at) >= timeoutS_) return "no heartbeat for " + seconds(timeoutS_) + " s";
  return std::nullopt;
}

bool Liveness::beatSinceFirstLook(int id) const {
  const auto it = seen_.find(id);
  return it != seen_.end() && it->second.moved;
}

void Liveness::discountOwnGap() {
  const auto now = Clock::now();
  if (lastLook_ && now - *lastLook_ > std::chrono::duration<double>(timeoutS_ / 2)) {
    for (auto& entry : seen_) entry.second.at += now - *lastLook_;
  }
  lastLook_ = now;
}

Watcher::Watcher(const comm::StoreClientOptions& options, const Keys& keys, const Round& round, int self,
                 const ElasticOptions& elastic, Heartbeat& heartbeat)
    : client_(options), keys_(keys), round_(round), self_(self), elastic_(elastic), heartbeat_(heartbeat),
      thread_([this] { loop(); }) {}

Watcher::~Watcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

bool Watcher::stopWanted() {
  std::lock_guard<std::mutex> lock(mutex_);
  return wanted_;
}

std::optional<std::string> Watcher::failure() {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void Watcher::loop() {
  Liveness live(client_, keys_, elastic_.heartbeatTimeoutS);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_ && !wanted_) {
    lock.unlock();
    bool end = false;
    std::optional<std::string> failure;
    try {
      end = look(live);
    } catch (const std::exception& e) {
      end = true;  // stop the workers; the main thread finds out why
      failure = e.what();
    }
    lock.lock();
    if (end) wanted_ = true;
    if (failure) failure_ = failure;
    if (!wanted_) wake_.wait_for(lock, kWatchInterval, [this] { return stop_; });
  }
}

bool Watcher::look(Liveness& live) {
  if (const auto failure = heartbeat_.failure()) DDP_THROW(CommError, "this launcher's heartbeats failed (", *failure, ")");
  const std::string endKey = keys_.inRound(round_.number, "end");
  if (client_.check({endKey})) return true;
  bool someoneDone = false;
  for (int node : round_.nodes) {
    if (node == self_) continue;
    const auto gone = live.gone(node);
    if (!gone) continue;
    if (*gone == kDone) {
      someoneDone = true;
      continue;
    }
    endRound(client_, keys_, round_.number, 'L', "node " + std::to_string(node) + " left (" + *gone + ")");
    return true;
  }
  // Waiting nodes are admitted at the round's end: end it now, unless the job is finishing.
  if (!someoneDone && static_cast<int>(round_.nodes.size()) < elastic_.maxNodes &&
      client_.add(keys_.inRound(round_.number, "waiting"), 0) > 0) {
    endRound(client_, keys_, round_.number, 'J', "a node is waiting to join");
    return true;
  }
  return false;
}

}  // namespace ddp::launcher::elastic
