// How the launchers of an elastic job see each other: each one's heartbeat, whether the others
// still beat, and a watcher of the running round (launcher/elastic.h tells the protocol).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/store_client.h"
#include "launcher/elastic_store.h"
#include "launcher/launch_options.h"

namespace ddp::launcher::elastic {

/// Adds to this launcher's heartbeat counter from a connection of its own, every `interval`.
class Heartbeat {
 public:
  Heartbeat(const comm::StoreClientOptions& options, std::string key, std::chrono::milliseconds interval);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  /// Why the heartbeats stopped (its connection failed and could not be made again), or nothing.
  std::optional<std::string> failure();

 private:
  void loop();
  // One beat; a connection that failed is made again once (a reset, a host that stalled) before
  // the heartbeats count as lost.
  void beat();

  comm::StoreClientOptions options_;
  std::unique_ptr<comm::StoreClient> client_;
  std::optional<std::string> failure_;
  std::string key_;
  std::chrono::milliseconds interval_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

/// Tells whether other nodes are still in the job, from their heartbeats as this launcher sees them.
class Liveness {
 public:
  Liveness(comm::StoreClient& store, const Keys& keys, double timeoutS)
      : store_(store), keys_(keys), timeoutS_(timeoutS) {}

  /// Why node `id` is out of the job ("done", its launcher's reason, "no heartbeat for 30 s"),
  /// or nothing while it is in.
  std::optional<std::string> gone(int id);

  /// Whether node `id`'s heartbeat count moved after the first gone(id) saw it.
  bool beatSinceFirstLook(int id) const;

 private:
  // A look long after the one before (this launcher was stopped, or its requests waited on a
  // stalled store) would judge the others by a silence that was this launcher's own (issue 46
  // (18)): that time does not count. Half the timeout: an observer away for less still sees a
  // live node's beat (every timeout / 6) before the timeout.
  void discountOwnGap();

  struct Seen {
    bool known = false;
    std::int64_t beat = 0;
    Clock::time_point at;
    bool moved = false;  // the count changed since the first look
  };
  comm::StoreClient& store_;
  const Keys& keys_;
  double timeoutS_;
  std::map<int, Seen> seen_;
  std::optional<Clock::time_point> lastLook_;
};

/// Watches a running round from a connection of its own: another node's end reason, a member
/// that left or went silent, nodes waiting to join. stopWanted() turns true once the round ends.
class Watcher {
 public:
  Watcher(const comm::StoreClientOptions& options, const Keys& keys, const Round& round, int self,
          const ElasticOptions& elastic, Heartbeat& heartbeat);
  ~Watcher();
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

  bool stopWanted();
  /// Why the watcher itself stopped the workers (its connection failed), or nothing.
  std::optional<std::string> failure();

 private:
  void loop();
  bool look(Liveness& live);

  comm::StoreClient client_;
  const Keys& keys_;
  const Round round_;
  const int self_;
  const ElasticOptions& elastic_;
  Heartbeat& heartbeat_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool wanted_ = false;
  std::optional<std::string> failure_;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace ddp::launcher::elastic
