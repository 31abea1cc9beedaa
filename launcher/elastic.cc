#include "launcher/elastic.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/job_token.h"
#include "common/listen_socket.h"
#include "common/store_client.h"
#include "common/store_server.h"
#include "launcher/elastic_store.h"
#include "launcher/elastic_watch.h"
#include "launcher/exit_status.h"
#include "launcher/failure_summary.h"
#include "launcher/free_port.h"
#include "launcher/job_fingerprint.h"
#include "launcher/launch_plan.h"
#include "launcher/signal_watch.h"

namespace ddp::launcher {
namespace elastic {
namespace {

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

void Agent::pause(std::chrono::milliseconds time) {
  const auto deadline = Clock::now() + time;
  for (auto now = Clock::now(); now < deadline; now = Clock::now()) {
    const int signal = signals_.wait(std::chrono::ceil<std::chrono::milliseconds>(deadline - now));
    if (signal != 0 && signals_.isForwarded(signal)) throw Interrupted{signal};
  }
  // A zero pause still looks at the signals.
  if (time.count() == 0) {
    const int signal = signals_.wait(std::chrono::milliseconds(0));
    if (signal != 0 && signals_.isForwarded(signal)) throw Interrupted{signal};
  }
}

void Agent::checkFinal() {
  if (store_->check({keys_.final()})) throw JobEnded{text(store_->get(keys_.final(), store_->timeout())), kFailureExitCode};
  if (store_->check({keys_.finished()})) {
    throw JobEnded{previous_.empty() ? "the job finished before this node was admitted" : "the job finished", 0};
  }
}

void Agent::connect() {
  const int port = options_.masterPort ? *options_.masterPort : kDefaultMultiNodePort;
  const std::string bind = options_.rdzvBind.empty() ? options_.masterAddr : options_.rdzvBind;
  try {
    ListenSocket socket(bind, port);
    comm::StoreServerOptions serverOptions;
    serverOptions.token = token_;
    server_ = std::make_unique<comm::StoreServer>(socket.release(), serverOptions);
  } catch (const ConfigError& e) {
    // Another launcher holds the port, or the address is not this machine's: join its store.
    spdlog::debug("not hosting the rendezvous ({})", e.what());
  }
  clientOptions_.host = options_.masterAddr;
  clientOptions_.port = static_cast<std::uint16_t>(port);
  clientOptions_.token = token_;
  clientOptions_.who = "this launcher";
  clientOptions_.server = "the launcher hosting the rendezvous";
  // Short tries, so a signal is seen while no launcher hosts the store yet.
  const auto start = Clock::now();
  const auto deadline = start + millis(elastic_.rdzvTimeoutS);
  bool told = false;
  int silent = 0;  // tries in a row where something accepted the connection but never greeted
  while (!store_) {
    StoreClientOptions attempt = clientOptions_;
    attempt.timeout = std::min(std::chrono::milliseconds(1000),
                               std::max(std::chrono::milliseconds(1), std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now())));
    try {
      store_ = std::make_unique<StoreClient>(attempt);
    } catch (const comm::StoreUnreachableError& e) {
      if (Clock::now() >= deadline) {
        throw JobEnded{"no launcher hosts the rendezvous at " + where() + " after --rdzv_timeout_s=" +
                           seconds(elastic_.rdzvTimeoutS) + " s (" + e.reason() +
                           "); start the launcher of the host --master_addr names, with the same --master_port",
                       kFailureExitCode};
      }
      silent = e.reason() == "no greeting" ? silent + 1 : 0;
      if (silent >= 3) {
        DDP_THROW(ConfigError, "the rendezvous port ", where(), " is held by a program that is not a ddp-launch store (it "
                  "accepts connections but never greets); pick a free --master_port for the job");
      }
      if (!told && secondsSince(start) >= 5) {
        spdlog::info("waiting for the launcher that hosts the rendezvous at {} ({})", where(), e.reason());
        told = true;
      }
      pause(std::chrono::milliseconds(0));
    } catch (const comm::StoreAuthError& e) {
      DDP_THROW(ConfigError, "rendezvous: ", e.what(),
                "; every node of an elastic job needs the same token: pass the same --rdzv_token_file on each");
    } catch (const CommError& e) {  // after the two above: not our store at all
      DDP_THROW(ConfigError, "rendezvous: ", e.what(), "; give --master_addr/--master_port of the job's first launcher");
    }
  }
  // Bound, but the rendezvous is elsewhere (e.g. --rdzv_bind=0.0.0.0 on every node): not the host.
  if (server_ && server_->stats().admitted == 0) server_.reset();
  // A host that stops answering is noticed within the heartbeat timeout (and a few seconds).
  clientOptions_.timeout = std::max(kMinRequestTimeout, millis(elastic_.heartbeatTimeoutS));
  store_->setTimeout(clientOptions_.timeout);
  address_ = store_->localAddress();
  if (address_.empty()) address_ = options_.masterAddr;
  checkSameJob();
  nodeId_ = static_cast<int>(store_->add(keys_.nodeIds(), 1) - 1);
  store_->set(keys_.node(nodeId_), bytes(std::to_string(options_.nprocPerNode)));
  heartbeat_ = std::make_unique<Heartbeat>(clientOptions_, keys_.heartbeat(nodeId_), heartbeatInterval());
  spdlog::info("elastic job '{}' ({}..{} nodes): this is node {} at {}; {} the rendezvous at {}", elastic_.rdzvId,
               elastic_.minNodes, elastic_.maxNodes, nodeId_, address_, server_ ? "hosting" : "joined", where());
}

void Agent::checkSameJob() {
  // The hosting launcher names the job (in the moment before its own connection another launcher
  // may have been first); the others compare.
  const std::string servedKey = "elastic/served_job";
  if (server_) store_->set(servedKey, bytes(elastic_.rdzvId));
  const std::string served = text(store_->compareSet(servedKey, {}, bytes(elastic_.rdzvId)));
  if (served != elastic_.rdzvId) {
    DDP_THROW(ConfigError, "the rendezvous at ", where(), " serves elastic job '", served,
              "' and this launcher's --rdzv_id is '", elastic_.rdzvId,
              "': give every node of one job the same --rdzv_id, and another job its own --master_port");
  }
  const JobFingerprint mine = fingerprintOf(options_);
  const std::string fingerprintKey = keys_.prefix + "fingerprint";
  if (server_) store_->set(fingerprintKey, bytes(mine.text()));
  const std::string job = text(store_->compareSet(fingerprintKey, {}, bytes(mine.text())));
  if (const auto difference = firstDifference(JobFingerprint::parse(job), mine)) {
    DDP_THROW(ConfigError, "this node does not match elastic job '", elastic_.rdzvId, "' at ", where(), ": ",
              *difference, "; every node of an elastic job runs the same command (launcher flags, worker and its "
              "arguments; a file argument may lie at another path with the same content)");
  }
}

std::optional<std::string> Agent::lostNode(const Round& round) {
  if (store_->check({keys_.inRound(round.number, "end")})) return std::nullopt;  // another node told why
  // A live node beats within an interval; three intervals and a tick leave room for a busy one.
  const auto window = 3 * heartbeatInterval() + kTick;
  const double windowS = std::chrono::duration<double>(window).count();
  Liveness live(*store_, keys_, windowS);
  std::vector<int> silent;  // not yet seen beating
  for (int node : round.nodes) {
    if (node == nodeId_) continue;
    const auto gone = live.gone(node);  // the first look: a node that left says so at once
    if (gone && *gone != kDone) return "node " + std::to_string(node) + " left (" + *gone + ")";
    if (!gone) silent.push_back(node);
  }
  const auto deadline = Clock::now() + window;
  while (!silent.empty()) {
    for (auto at = silent.begin(); at != silent.end();) {
      const auto gone = live.gone(*at);
      if (gone && *gone != kDone) {
        return "node " + std::to_string(*at) + " left (" + *gone + " after a worker of node " + std::to_string(nodeId_) +
               " failed)";
      }
      // Beating (its count moved since the first look) or done: not the cause.
      at = gone || live.beatSinceFirstLook(*at) ? silent.erase(at) : std::next(at);
    }
    if (silent.empty() || Clock::now() >= deadline + kTick) break;
    pause(kTick);
  }
  return std::nullopt;
}

bool Agent::shouldClose(const std::vector<int>& members, const std::vector<int>& previous, Liveness& live,
                        Clock::time_point lastArrival) const {
  const int n = static_cast<int>(members.size());
  if (n < elastic_.minNodes) return false;
  // The nodes of the last round that are still alive come back after stopping their workers, and
  // have their places (newcomers may have been quicker).
  for (int node : previous) {
    if (!contains(members, node) && !live.gone(node)) return false;
  }
  return n >= elastic_.maxNodes || secondsSince(lastArrival) >= elastic_.lastCallS;
}

Round Agent::join() {
  auto deadline = Clock::now() + millis(elastic_.rdzvTimeoutS);
  while (true) {
    checkFinal();
    const std::int64_t k = store_->add(keys_.round(), 0);
    round_ = k;
    store_->append(keys_.inRound(k, "members"), bytes(std::to_string(nodeId_) + ","));
    const std::vector<int> closed = awaitClosed(k, lastRoundNodes(k), deadline);
    if (const auto at = std::find(closed.begin(), closed.end(), nodeId_); at != closed.end()) {
      return Round{k, closed, static_cast<int>(at - closed.begin())};
    }
    waitForAdmission(k, closed);
    deadline = Clock::now() + millis(elastic_.rdzvTimeoutS);
  }
}

std::vector<int> Agent::lastRoundNodes(std::int64_t k) {
  if (k > 0 && store_->check({keys_.inRound(k - 1, "closed")})) {
    return parseIds(text(store_->get(keys_.inRound(k - 1, "closed"), store_->timeout())));
  }
  return {};
}

std::vector<int> Agent::presentMembers(std::int64_t k) {
  // Members that left again (a signal while waiting) do not count.
  std::vector<int> members;
  for (int node : parseIds(text(store_->get(keys_.inRound(k, "members"), store_->timeout())))) {
    if (!contains(members, node) && !store_->check({keys_.left(node)})) members.push_back(node);
  }
  return members;
}

std::vector<int> Agent::awaitClosed(std::int64_t k, const std::vector<int>& previous, Clock::time_point deadline) {
  const std::string closedKey = keys_.inRound(k, "closed");
  Liveness live(*store_, keys_, elastic_.heartbeatTimeoutS);
  size_t arrivals = 0;
  auto lastArrival = Clock::now();
  while (true) {
    if (store_->check({closedKey})) return parseIds(text(store_->get(closedKey, store_->timeout())));
    std::vector<int> members = presentMembers(k);
    if (members.size() != arrivals) {
      arrivals = members.size();
      lastArrival = Clock::now();
    }
    if (shouldClose(members, previous, live, lastArrival)) {
      // The last round's nodes first, then the others by arrival, up to MAX.
      std::stable_partition(members.begin(), members.end(), [&](int node) { return contains(previous, node); });
      std::vector<int> chosen(members.begin(),
                              members.begin() + std::min<std::ptrdiff_t>(static_cast<std::ptrdiff_t>(members.size()),
                                                                         elastic_.maxNodes));
      std::sort(chosen.begin(), chosen.end());
      return parseIds(text(store_->compareSet(closedKey, {}, bytes(joinIds(chosen)))));
    }
    if (Clock::now() >= deadline) endOnRendezvousTimeout(k, members, previous);
    pause(kTick);
    checkFinal();
  }
}

void Agent::endOnRendezvousTimeout(std::int64_t k, const std::vector<int>& members, const std::vector<int>& previous) {
  std::string why;
  if (static_cast<int>(members.size()) < elastic_.minNodes) {
    why = "rendezvous round " + std::to_string(k) + " has " + std::to_string(members.size()) +
          " of the at least " + std::to_string(elastic_.minNodes) + " nodes it needs (" +
          (members.empty() ? "none" : "nodes " + joinIds(members)) + ")";
  } else {
    std::vector<int> missing;
    for (int node : previous) {
      if (!contains(members, node)) missing.push_back(node);
    }
    why = "rendezvous round " + std::to_string(k) + " did not close (nodes " + joinIds(members) +
          " are in; node(s) " + joinIds(missing) + " of the last round still send heartbeats but did not come back)";
  }
  why += " after --rdzv_timeout_s=" + seconds(elastic_.rdzvTimeoutS) +
         " s; the job ends (resume: auto continues it from its last checkpoint when started again)";
  store_->compareSet(keys_.final(), {}, bytes(why));  // every launcher still waiting ends alike
  throw JobEnded{why, kFailureExitCode};
}

void Agent::waitForAdmission(std::int64_t k, const std::vector<int>& closed) {
  spdlog::info("round {} runs with nodes {} already; waiting to be admitted when it ends", k, joinIds(closed));
  store_->add(keys_.inRound(k, "waiting"), 1);
  waiting_ = true;
  // The running nodes end the round for us; if they are all gone, nobody would: then we do.
  Liveness running(*store_, keys_, elastic_.heartbeatTimeoutS);
  while (store_->add(keys_.round(), 0) == k) {
    checkFinal();
    bool allGone = true;
    std::string why;
    for (int node : closed) {
      const auto gone = running.gone(node);
      if (!gone || *gone == kDone) {
        allGone = false;
        break;
      }
      why += (why.empty() ? "" : ", ") + std::string("node ") + std::to_string(node) + " left (" + *gone + ")";
    }
    if (allGone) {
      endRound(*store_, keys_, k, 'L', why);
      store_->compareSet(keys_.round(), bytes(std::to_string(k)), bytes(std::to_string(k + 1)));
    }
    pause(kTick * 2);
  }
  waiting_ = false;
}

void Agent::logRound(const Round& round) {
  std::string line = "round " + std::to_string(round.number) + ": nodes " + joinIds(round.nodes) + " (world " +
                     std::to_string(static_cast<int>(round.nodes.size()) * options_.nprocPerNode) + ")";
  for (int node : previous_) {
    if (contains(round.nodes, node)) continue;
    std::string why = "not admitted";
    if (store_->check({keys_.left(node)})) {
      why = text(store_->get(keys_.left(node), store_->timeout()));
    } else {
      why = "no heartbeat for " + seconds(elastic_.heartbeatTimeoutS) + " s";
    }
    line += ", node " + std::to_string(node) + " left (" + why + ")";
  }
  if (!previous_.empty()) {
    for (int node : round.nodes) {
      if (!contains(previous_, node)) line += ", node " + std::to_string(node) + " joined";
    }
  }
  spdlog::info("{}", line);
}

std::optional<LaunchPlan> Agent::planFor(const Round& round) {
  for (int node : round.nodes) {
    const std::string nproc = text(store_->get(keys_.node(node), store_->timeout()));
    if (nproc != std::to_string(options_.nprocPerNode)) {
      throw JobEnded{"node " + std::to_string(node) + " runs " + nproc + " workers and this node " +
                         std::to_string(options_.nprocPerNode) +
                         "; every node of an elastic job needs the same --nproc_per_node",
                     kUsageExitCode};
    }
  }
  LaunchOptions options = options_;
  options.nnodes = static_cast<int>(round.nodes.size());
  options.nodeRank = round.index;
  options.rdzvBind.clear();  // the rendezvous' bind address, not the workers'
  options.rdzvTokenFile.clear();
  EnvMap environment = environment_;
  environment.erase(kTokenFileEnv);
  environment[kTokenEnv] = token_;
  const std::string masterKey = keys_.inRound(round.number, "master");
  LaunchPlan plan;
  if (round.index == 0) {
    // Rank 0's store on a fresh port of this node, bound before it is published.
    options.masterAddr = address_;
    options.masterPort = isPythonInterpreter(options_.worker) ? pickFreePort(address_) : 0;
    plan = makeLaunchPlan(options, environment);
    store_->set(masterKey, bytes(address_ + " " + std::to_string(plan.masterPort)));
  } else {
    Liveness live(*store_, keys_, elastic_.heartbeatTimeoutS);
    while (!store_->check({masterKey})) {
      if (store_->check({keys_.inRound(round.number, "end")})) return std::nullopt;
      if (const auto gone = live.gone(round.nodes.front())) {
        endRound(*store_, keys_, round.number, 'L',
                 "node " + std::to_string(round.nodes.front()) + " left (" + *gone + ")");
        return std::nullopt;
      }
      pause(kTick);
    }
    std::istringstream master(text(store_->get(masterKey, store_->timeout())));
    int port = 0;
    master >> options.masterAddr >> port;
    options.masterPort = port;
    plan = makeLaunchPlan(options, environment);
  }
  plan.attempt = static_cast<int>(round.number);
  plan.elastic = true;
  const std::string attempt = std::to_string(round.number);
  for (WorkerCommand& command : plan.commands) {
    command.env["TORCHELASTIC_RESTART_COUNT"] = attempt;
    command.env["DDP_RESTART_COUNT"] = attempt;
    command.env["TORCHELASTIC_RUN_ID"] = elastic_.rdzvId;
  }
  return plan;
}

void Agent::leave(const std::string& why) {
  // The others' watchers (or rendezvous) see it at their next look and go on without this node; a
  // round this node only waits for is not ended by it.
  if (!store_ || nodeId_ < 0) return;
  try {
    store_->set(keys_.left(nodeId_), bytes(why));
    if (waiting_) store_->add(keys_.inRound(round_, "waiting"), -1);  // nobody to admit any more
    waiting_ = false;
  } catch (const std::exception&) {
    // The store is gone too: nothing to tell.
  }
}

void Agent::waitForOthers() {
  // The others still use this launcher's store until their workers are done, and nodes waiting to
  // be admitted until they have read that the job is over.
  try {
    Liveness live(*store_, keys_, elastic_.heartbeatTimeoutS);
    std::vector<int> nodes = previous_;
    const std::string members = keys_.inRound(round_, "members");
    if (store_->check({members})) {
      for (int node : parseIds(text(store_->get(members, store_->timeout())))) {
        if (!contains(nodes, node)) nodes.push_back(node);
      }
    }
    nodes.erase(std::remove(nodes.begin(), nodes.end(), nodeId_), nodes.end());
    while (!nodes.empty()) {
      nodes.erase(std::remove_if(nodes.begin(), nodes.end(), [&](int node) { return live.gone(node).has_value(); }),
                  nodes.end());
      if (!nodes.empty()) pause(kTick);
    }
  } catch (const Interrupted&) {
    // Told to stop: the others lose the store, and say so.
  } catch (const ddp::Error&) {
    // Nothing more to wait for.
  }
}

std::optional<int> Agent::runRound(const Round& round) {
  const std::optional<LaunchPlan> plan = planFor(round);
  SupervisionOptions supervision = supervision_;
  AttemptReport report;
  std::optional<std::string> watchFailure;
  if (plan) {
    Watcher watcher(clientOptions_, keys_, round, nodeId_, elastic_, *heartbeat_);
    supervision.stopRequested = [&watcher] { return watcher.stopWanted(); };
    supervision.onSignal = [this](int signal) { leave("its launcher received " + signalName(signal)); };
    report = runAttempt(*plan, supervision, signals_);
    watchFailure = watcher.failure();
  } else {
    report.stoppedOnRequest = true;  // ended before it started: the reason is in the store
  }
  previous_ = round.nodes;
  if (report.launcherSignal != 0) {
    leave("its launcher received " + signalName(report.launcherSignal));
    return 128 + report.launcherSignal;
  }
  if (!report.firstFailure && !report.stoppedOnRequest) {
    store_->set(keys_.finished(), bytes("1"));  // waiting nodes: nothing left to join
    store_->set(keys_.left(nodeId_), bytes(kDone));
    if (server_) waitForOthers();
    return 0;
  }
  std::optional<ExitStatus> ownFailure;
  std::string ownWhy;
  std::optional<std::string> lost;
  std::string standing;
  if (report.firstFailure) {
    const RankReport& failed = report.ranks[*report.firstFailure];
    ownFailure = failed.status;
    const bool configError = !failed.status.signaled && failed.status.code == kWorkerConfigErrorCode;
    ownWhy = "node " + std::to_string(nodeId_) + ": rank " + std::to_string(failed.rank) + " " + describeFailure(failed);
    // A peer node's death fails this node's ranks too (issue 46 (13)): then that node is named.
    lost = configError ? std::nullopt : lostNode(round);
    standing = lost ? endRound(*store_, keys_, round.number, 'L', *lost)
                    : endRound(*store_, keys_, round.number, configError ? 'C' : 'F', ownWhy);
  } else if (watchFailure && !store_->check({keys_.inRound(round.number, "end")})) {
    // This launcher's own connections failed while the store still answers this one.
    if (const auto failure = heartbeat_->failure()) {
      DDP_THROW(CommError, "this launcher's heartbeats failed (", *failure, ")");
    }
    standing = endRound(*store_, keys_, round.number, 'F',
                        "node " + std::to_string(nodeId_) + ": its launcher lost a connection to the rendezvous (" +
                            *watchFailure + ")");
  } else {
    standing = text(store_->get(keys_.inRound(round.number, "end"), store_->timeout()));
  }
  const EndReason end = parseEnd(standing);
  spdlog::warn("round {} ended: {}", round.number, end.why);
  // Another node's report came first (often the consequence: its ranks lost their peer here).
  if (!ownWhy.empty() && end.why != ownWhy) {
    spdlog::warn("round {}: here too, {} ({})", round.number, ownWhy,
                 lost ? "after that node was lost: likely a consequence" : "another node reported its failure first");
  }
  // A worker's bad configuration is every node's (the same command line): exit 2 everywhere.
  const int ownCode = ownFailure ? ownFailure->shellCode() : end.kind == 'C' ? kUsageExitCode : kFailureExitCode;
  auto finish = [&](const std::string& why) {
    store_->compareSet(keys_.final(), {}, bytes(why));
    store_->set(keys_.left(nodeId_), bytes("the job ended"));
    spdlog::error("{}", why);
    if (ownFailure) {
      for (const std::string& line : formatFailureSummary(report)) spdlog::error("{}", line);
    }
    if (server_) waitForOthers();  // until every node has read why
    return ownCode;
  };
  if (end.kind == 'C') {
    return finish("the job ends: " + end.why + " (bad configuration), which every restart would repeat");
  }
  if (end.kind != 'J' && end.failures > options_.maxRestarts) {
    return finish("the job ends: " + end.why + " was failure " + std::to_string(end.failures) + " and --max_restarts=" +
                  std::to_string(options_.maxRestarts));
  }
  if (end.kind != 'J') {
    spdlog::warn("restarting with the nodes still there (restart {}/{})", end.failures, options_.maxRestarts);
  }
  // Whoever gets here first opens the next round.
  store_->compareSet(keys_.round(), bytes(std::to_string(round.number)), bytes(std::to_string(round.number + 1)));
  return std::nullopt;
}

int Agent::run() {
  try {
    connect();
    while (true) {
      const Round round = join();
      logRound(round);
      if (const auto code = runRound(round)) return *code;
    }
  } catch (const Interrupted& interrupted) {
    spdlog::warn("received {} while waiting for the rendezvous; leaving the job", signalName(interrupted.signal));
    leave("its launcher received " + signalName(interrupted.signal));
    return 128 + interrupted.signal;
  } catch (const JobEnded& ended) {
    if (ended.code == 0) {
      spdlog::info("{}", ended.why);
    } else {
      spdlog::error("{}", ended.why);
    }
    leave(ended.code == 0 ? kDone : "the job ended");
    if (server_) waitForOthers();
    return ended.code;
  } catch (const ConfigError&) {
    leave("its launcher stopped on bad input");
    if (server_) waitForOthers();
    throw;
  } catch (const ddp::Error& e) {
    // CommError or TimeoutError of this launcher's store connection.
    leave("its launcher lost the rendezvous");
    spdlog::error("the rendezvous store at {} ({}) stopped answering ({}); the job cannot go on without it: start it "
                  "again, and resume: auto continues from the last checkpoint",
                  where(), server_ ? "hosted here" : "hosted by another node's launcher", e.what());
    return kFailureExitCode;
  }
}

}  // namespace
}  // namespace elastic

int runElastic(const LaunchOptions& options, const EnvMap& environment, const SupervisionOptions& supervision) {
  // The job's token: the nodes share one, so nothing else can join (a file, as for fixed multi-node jobs).
  std::string token;
  if (!options.rdzvTokenFile.empty()) {
    token = readTokenFile(options.rdzvTokenFile);
  } else if (auto file = environment.find(kTokenFileEnv); file != environment.end() && !file->second.empty()) {
    token = readTokenFile(file->second);
  } else if (auto given = environment.find(kTokenEnv); given != environment.end() && !given->second.empty()) {
    token = checkedToken(given->second, kTokenEnv);
  } else {
    DDP_THROW(ConfigError, "--nnodes=", options.elastic.minNodes, ":", options.elastic.maxNodes,
              ": the nodes of an elastic job share a secret token, so nothing else can join it; put one in a file "
              "every node can read (mode 600) and pass --rdzv_token_file=PATH on each node, e.g. "
              "(umask 077; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > ~/.ddp_token)");
  }
  // Before any thread starts (the store's, the heartbeat's): they inherit the blocked signals.
  SignalWatch signals;
  elastic::Agent agent(options, environment, supervision, signals, token);
  return agent.run();
}

}  // namespace ddp::launcher
