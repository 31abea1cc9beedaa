// The elastic agent: one per node, it joins rendezvous rounds at the job's store (hosted by one of
// the launchers), runs this node's workers for each round it is admitted to, and leaves or ends the
// job. Rendezvous in elastic_rendezvous.cc, the rounds' runs in elastic.cc. Internal to the launcher.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/store_client.h"
#include "common/store_server.h"
#include "launcher/elastic.h"
#include "launcher/elastic_store.h"
#include "launcher/elastic_watch.h"
#include "launcher/launch_plan.h"
#include "launcher/signal_watch.h"

namespace ddp::launcher::elastic {

using comm::StoreClient;
using comm::StoreClientOptions;

// How often a waiting launcher looks at the store again (and at its signals).
constexpr std::chrono::milliseconds kTick{100};
// A launcher that is not told better: the job failed, or the store is gone.
constexpr int kFailureExitCode = 1;
// Bad input (as for the command line).
constexpr int kUsageExitCode = 2;
// Requests of the launchers' own connections answer within this at least (see StoreClient).
constexpr std::chrono::milliseconds kMinRequestTimeout{5000};

// This launcher got a forwarded signal while it waited.
struct Interrupted {
  int signal;
};

// The job is over for this launcher: one line, this exit code.
struct JobEnded {
  std::string why;
  int code;
};

class Agent {
 public:
  Agent(const LaunchOptions& options, const EnvMap& environment, const SupervisionOptions& supervision,
        SignalWatch& signals, std::string token)
      : options_(options), elastic_(options.elastic), environment_(environment), supervision_(supervision),
        signals_(signals), token_(std::move(token)), keys_{"elastic/" + options.elastic.rdzvId + "/"} {}

  int run();

 private:
  void connect();
  // Joins the current rendezvous round (or, when it runs without this node, the next one) and
  // returns it once it closed with this node in it.
  Round join();
  // The nodes of round k-1, whose places in round k are kept for them.
  std::vector<int> lastRoundNodes(std::int64_t k);
  // The members of round k that have not left again.
  std::vector<int> presentMembers(std::int64_t k);
  // Waits until round k closes (closing it when shouldClose() says so) and returns its nodes.
  std::vector<int> awaitClosed(std::int64_t k, const std::vector<int>& previous, Clock::time_point deadline);
  // Round k did not close in time: ends the job for every launcher, with why.
  [[noreturn]] void endOnRendezvousTimeout(std::int64_t k, const std::vector<int>& members,
                                           const std::vector<int>& previous);
  // Round k runs without this node: waits until it ends (ending it when all its nodes are gone).
  void waitForAdmission(std::int64_t k, const std::vector<int>& closed);
  bool shouldClose(const std::vector<int>& members, const std::vector<int>& previous, Liveness& live,
                   Clock::time_point lastArrival) const;
  void logRound(const Round& round);
  std::optional<int> runRound(const Round& round);
  /// This node's plan for `round`; nothing when the round ended before its workers started.
  std::optional<LaunchPlan> planFor(const Round& round);
  // The hosting launcher, before it exits: until every node of the current round, admitted or
  // waiting, is done, has left, or is silent (bounded by the heartbeat timeout after they stop).
  void waitForOthers();
  void leave(const std::string& why);
  // Waits `time`, watching the forwarded signals; throws Interrupted on one.
  void pause(std::chrono::milliseconds time);
  void checkFinal();
  std::string where() const { return clientOptions_.host + ":" + std::to_string(clientOptions_.port); }
  // Every heartbeat_timeout / 6, at most a second (one small request: cheap for the store).
  std::chrono::milliseconds heartbeatInterval() const {
    return std::clamp(millis(elastic_.heartbeatTimeoutS / 6), std::chrono::milliseconds(50), std::chrono::milliseconds(1000));
  }
  // Refuses a launcher that is not of the job the store serves: another --rdzv_id on its port, or
  // another command than the job's (issue 46 (9, 10)), before it takes part in anything.
  void checkSameJob();
  // After a worker of this node failed: a node of the round that left or stopped beating, the
  // likelier cause (its ranks' peers here see their connections reset), or nothing.
  std::optional<std::string> lostNode(const Round& round);

  const LaunchOptions& options_;
  const ElasticOptions& elastic_;
  const EnvMap environment_;
  const SupervisionOptions supervision_;
  SignalWatch& signals_;
  const std::string token_;
  const Keys keys_;
  std::unique_ptr<comm::StoreServer> server_;  // this launcher hosts the rendezvous
  StoreClientOptions clientOptions_;
  std::unique_ptr<StoreClient> store_;
  std::unique_ptr<Heartbeat> heartbeat_;
  int nodeId_ = -1;
  std::string address_;             // where the other nodes reach this one
  std::vector<int> previous_;       // the nodes of the last round this launcher ran in
  std::int64_t round_ = 0;          // the round this launcher last joined (or waits for)
  bool waiting_ = false;            // counted in round_'s "waiting"
};

}  // namespace ddp::launcher::elastic
