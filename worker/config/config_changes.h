// What a resumed run changes of the run that wrote its checkpoint: the settings of the training
// itself (model, optimizer, schedule, batch, data), not where it writes, how long it runs or how
// it communicates.
#pragma once

#include <string>
#include <vector>

#include "worker/config/config.h"

namespace ddp::worker {

struct ConfigChange {
  std::string key;
  std::string saved;  // the checkpoint's run's value
  std::string now;    // this run's
};

/// Whether a different value of `key` on resume changes the training that continues (train.lr,
/// train.batch_size, model.dropout, ...) as against where and how long it runs (output.*,
/// checkpoint.*, train.epochs, train.max_steps), how it is computed or communicated alike
/// (train.sharding, comm.bucket_cap_mb, data.num_workers) or what is only evaluated.
bool changesTheTraining(const std::string& key);

/// The keys for which changesTheTraining() holds whose values differ, in configKeys() order.
std::vector<ConfigChange> trainingChanges(const WorkerConfig& saved, const WorkerConfig& now);

/// The lines for rank 0's log ('\n' between them), or "" when `savedYaml` (the checkpoint's recorded
/// config) is empty, does not parse with this version's keys, or nothing that changes the training
/// differs: the training settings changed, then, with a cosine/linear decay ending at the run's
/// last step (train.decay_steps 0), a changed train.max_steps or train.epochs (the schedule stretches).
std::string describeResumeChanges(const std::string& savedYaml, const WorkerConfig& now, const std::string& path);

}  // namespace ddp::worker
