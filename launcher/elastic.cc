// The elastic agent's runs: each round's launch plan and workers, leaving, the hosting launcher's
// wait for the others, and runElastic. The rendezvous: elastic_rendezvous.cc.
#include "launcher/elastic.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/job_token.h"
#include "common/store_client.h"
#include "launcher/elastic_agent.h"
#include "launcher/elastic_store.h"
#include "launcher/elastic_watch.h"
#include "launcher/exit_status.h"
#include "launcher/failure_summary.h"
#include "launcher/free_port.h"
#include "launcher/launch_plan.h"
#include "launcher/signal_watch.h"
#include "launcher/worker_env.h"
#include "launcher/worker_path.h"

namespace ddp::launcher {
namespace elastic {

void Agent::pause(std::chrono::milliseconds time) {
  const auto deadline = Clock::now() + time;
  for (auto now = Clock::now(); now < deadline; now = Clock::now()) {
    const int signal = signals_.wait(std::chrono::ceil<std::chrono::milliseconds>(deadline - now));
    if (SignalWatch::suspendedOn(signal)) continue;
    if (signal != 0 && signals_.isForwarded(signal)) throw Interrupted{signal};
  }
  // A zero pause still looks at the signals.
  if (time.count() == 0) {
    const int signal = signals_.wait(std::chrono::milliseconds(0));
    SignalWatch::suspendedOn(signal);
    if (signal != 0 && signals_.isForwarded(signal)) throw Interrupted{signal};
  }
}

void Agent::checkFinal() {
  if (store_->check({keys_.final()})) throw JobEnded{text(store_->get(keys_.final(), store_->timeout())), kFailureExitCode};
  if (store_->check({keys_.finished()})) {
    throw JobEnded{previous_.empty() ? "the job finished before this node was admitted" : "the job finished", 0};
  }
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
    const auto path = environment.find("PATH");
    const std::string workerPath = resolveWorkerPath(options_.worker, path != environment.end() ? path->second : "/bin:/usr/bin");
    options.masterPort = workerRunsPython(options_, workerPath) ? pickFreePort(address_) : 0;
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
  } else if (options.elastic.maxNodes == 1) {
    token = newJobToken();  // one node at most (torchrun's --nnodes=1:1): no other node needs it
  } else {
    // As given: --nnodes=2 with --rdzv_backend=c10d is the elastic 2:2, but the user wrote 2.
    const std::string nodes = options.elastic.minNodes == options.elastic.maxNodes
                                  ? std::to_string(options.elastic.minNodes)
                                  : std::to_string(options.elastic.minNodes) + ":" + std::to_string(options.elastic.maxNodes);
    DDP_THROW(ConfigError, "--nnodes=", nodes,
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
