// The elastic agent's rendezvous: connecting to (or hosting) the job's store, checking it is this
// job's, joining a round, waiting for it to close or for admission, and telling which node left.
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
#include "common/listen_socket.h"
#include "launcher/elastic_agent.h"
#include "launcher/free_port.h"
#include "launcher/job_fingerprint.h"

namespace ddp::launcher::elastic {

void Agent::connect() {
  const int port = options_.masterPort ? *options_.masterPort : kDefaultMultiNodePort;
  const std::string bind = options_.rdzvBind.empty() ? options_.masterAddr : options_.rdzvBind;
  try {
    ListenSocket socket(bind, port);
    comm::StoreServerOptions serverOptions;
    serverOptions.token = token_;
    const int fd = socket.release();
    serverOptions.keepAlive = std::make_shared<ListenSocket>(std::move(socket));
    server_ = std::make_unique<comm::StoreServer>(fd, serverOptions);
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

}  // namespace ddp::launcher::elastic
