// Elastic jobs (--nnodes=MIN:MAX): nodes leave and join, and the job goes on with those there.
//
// One launcher hosts the rendezvous store: the one that can bind --master_addr:--master_port (the
// others are its clients, authenticated with the job's token like every worker). The store lives
// in that launcher, not in a worker, so it outlives every worker of its node; if that launcher
// itself dies, the store is gone and every other launcher ends with one line (exit 1) after
// stopping its workers: restart the job, and `resume: auto` continues from the last checkpoint.
//
// Rounds. Each launcher appends itself to the open round's member list. The round closes when
// MAX nodes are in, or when at least MIN are in, every node of the previous round that is still
// alive has come back, and no new node arrived for --rdzv_last_call_s. Node ranks follow the
// order in which nodes first joined the job (their node id), so they are stable across rounds;
// the round's node 0 binds a fresh port for rank 0's store and publishes it. A node arriving
// while a round runs waits and is admitted at its end: the running launchers see it waiting and
// stop their workers with SIGTERM (our worker checkpoints at the step every rank agrees on, so
// nothing is lost), and all meet in the next round.
//
// Admission. A launcher arriving with another --rdzv_id than the store's job, or another command
// (launcher flags, worker, arguments: launcher/job_fingerprint.h), is refused before it joins.
//
// Heartbeats. Every launcher adds to its heartbeat counter every heartbeat_timeout / 6 (at most
// 1 s) from its own connection. A member whose counter has not moved for --heartbeat_timeout_s
// has left: the others stop their workers and start the next round without it. A launcher that
// gets SIGTERM/SIGINT says it is leaving, so the others go on at once.
//
// --max_restarts counts the rounds that end in a failure (a worker failed, a node left); a round
// ended to admit waiting nodes does not count (as in torchrun). A worker's bad configuration
// (exit 2) ends the job on every node. A round that cannot gather MIN nodes within
// --rdzv_timeout_s ends the job: every launcher still there exits 1 with one line.
//
// Files: elastic.cc the agent (rounds, admission, running a round), elastic_store.h the job's keys
// and end reasons in the store, elastic_watch.h the heartbeats and the round's watcher.
#pragma once

#include "launcher/launch_options.h"
#include "launcher/worker_env.h"
#include "launcher/worker_supervisor.h"

namespace ddp::launcher {

/// Runs this node's part of the elastic job `options` (options.elastic.enabled) to the end and
/// returns the launcher's exit code: 0 when the job finished, the failed worker's exit code on
/// the node where the last failure was, 1 on the others and for a lost store or a rendezvous
/// timeout, 128 + signal when this launcher was told to stop. Throws ddp::ConfigError for bad
/// input found before anything started (no token file).
int runElastic(const LaunchOptions& options, const EnvMap& environment, const SupervisionOptions& supervision);

}  // namespace ddp::launcher
