// Every rank must train with the same configuration: a rank with another train.max_steps
// would leave the others waiting in a collective. Checked once, right after the rendezvous.
#pragma once

#include "ddp/process_group.h"
#include "worker/config/config.h"

namespace ddp::worker {

/// Keys that may differ between ranks: per-node paths and per-process tuning.
bool mayDifferAcrossRanks(const std::string& key);

/// Collective. Rank 0's per-key hashes are broadcast, each rank compares them with its own,
/// and the mismatches are summed, so every rank throws the same ConfigError naming the keys
/// that differ (with this rank's value) when any rank resolved a different config.
void checkConfigAgreement(const WorkerConfig& config, ProcessGroup& group);

}  // namespace ddp::worker
