// Turning the parsed options into the exact commands to start, before starting any.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/listen_socket.h"

#include "launcher/launch_options.h"
#include "launcher/worker_env.h"
#include "launcher/worker_process.h"

namespace ddp::launcher {

/// Everything needed to start this node's workers; every check that can fail has run.
struct LaunchPlan {
  std::vector<WorkerCommand> commands;  // by local rank
  std::vector<int> ranks;               // global rank of each command
  int masterPort = 0;
  double shutdownGraceS = 5.0;
  int attempt = 0;                      // restarts so far (TORCHELASTIC_RESTART_COUNT)
  int maxRestarts = 0;                  // --max_restarts
  bool portPicked = false;              // masterPort came from pickFreePort(): pick anew per attempt
  std::string masterAddr;               // where the port is picked
  std::string logDir;                   // --log_dir (created); empty: no log files
  bool tee = false;                     // --tee
  std::vector<int> consoleRanks;        // --local_ranks_filter / --ranks_filter: global ranks shown (empty: all)
  bool elastic = false;                 // one round of an elastic job: attempt_<K>/ logs always
  /// Node 0 with a ddp worker: the store's socket, bound at MASTER_ADDR:MASTER_PORT before any
  /// worker starts and handed to rank 0 (DDP_STORE_FD). Shared by the attempts that keep the port.
  std::shared_ptr<ListenSocket> storeSocket;
  std::string storeBindAddr;            // where storeSocket is bound

  /// Worker output goes to the console: always without --log_dir, with it only under --tee.
  bool outputToConsole() const { return logDir.empty() || tee; }
};

/// Resolves the worker program, takes MASTER_PORT (node 0 binds the store's socket there, a free
/// port for single-node jobs without --master_port), settles the job's token (a fresh one for a
/// single-node job, the --rdzv_token_file one for a multi-node job), creates --log_dir and builds
/// each worker's argv and environment from `inherited`. Logs the OMP_NUM_THREADS default once.
/// Throws ddp::ConfigError; starts nothing.
LaunchPlan makeLaunchPlan(const LaunchOptions& options, const EnvMap& inherited);

/// The plan for the next restart of `previous`: attempt + 1 in TORCHELASTIC_RESTART_COUNT and
/// DDP_RESTART_COUNT, and, when the port was picked, a fresh free port other than the previous
/// one (its old listener's connections may linger in TIME_WAIT). A port the user gave is kept.
LaunchPlan restartPlan(const LaunchPlan& previous);

/// Where rank `rank`'s output goes in `logDir`: rank_<N>.log when the job cannot restart
/// (maxRestarts == 0), else attempt_<K>/rank_<N>.log for every attempt, the first included, so
/// the layout depends only on the command line.
std::string rankLogPath(const LaunchPlan& plan, int rank);

}  // namespace ddp::launcher
