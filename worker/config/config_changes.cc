#include "worker/config/config_changes.h"

#include <map>
#include <string>
#include <tuple>

#include "common/error.h"

namespace ddp::worker {

bool changesTheTraining(const std::string& key) {
  // Sections whose keys all shape what is trained, but for these.
  static const char* const kAlike[] = {
      // how long and how often: a resumed run is often given more steps or epochs
      "train.epochs", "train.max_steps", "train.log_every",
      // the same training, computed or laid out otherwise (equal within rounding, tested so)
      "train.fused", "train.zero", "train.sharding", "train.cuda_graph", "train.channels_last",
      "train.activation_checkpointing", "train.shuffle",  // train.shuffle: checked at resume, refused
      // where the data is and how it is read, not what it is
      "data.root", "data.num_workers", "data.prefetch_batches", "data.pin_memory", "data.one_copy_per_host",
      "data.stream", "data.memory_budget_mb", "data.val_files", "data.test_file", "data.synthetic_test",
      "model.path"};
  for (const char* alike : kAlike) {
    if (key == alike) return false;
  }
  for (const char* section : {"model.", "train.", "data."}) {
    if (key.rfind(section, 0) == 0) return true;
  }
  // Lossy gradient communication changes the updates too.
  return key == "comm.compression" || key == "comm.hook" || key == "comm.powersgd_rank";
}

std::vector<ConfigChange> trainingChanges(const WorkerConfig& saved, const WorkerConfig& now) {
  std::map<std::string, std::string> before;
  for (auto& [key, value] : configValues(saved)) before.emplace(key, value);
  std::vector<ConfigChange> changes;
  for (auto& [key, value] : configValues(now)) {
    if (!changesTheTraining(key)) continue;
    const auto it = before.find(key);
    if (it != before.end() && it->second != value) changes.push_back({key, it->second, value});
  }
  return changes;
}

std::string describeResumeChanges(const std::string& savedYaml, const WorkerConfig& now, const std::string& path) {
  if (savedYaml.empty()) return "";
  WorkerConfig saved;
  try {
    saved = parseConfig(savedYaml);
  } catch (const Error&) {
    return "";  // another version's keys: nothing to compare reliably
  }
  const std::vector<ConfigChange> changes = trainingChanges(saved, now);
  // How long a run lasts is no training setting (a resumed run is often given more), but with
  // train.decay_steps unset the cosine/linear decay ends at the run's last step: a longer run
  // stretches the schedule, and the learning rate jumps at the resumed step.
  std::string stretched;
  const bool decays = now.train.lrSchedule == ddp::LrDecay::kCosine || now.train.lrSchedule == ddp::LrDecay::kLinear;
  if (decays && now.train.decaySteps == 0 && saved.train.decaySteps == 0) {
    for (const auto& [key, before, after] :
         {std::tuple<const char*, int64_t, int64_t>{"train.max_steps", saved.train.maxSteps, now.train.maxSteps},
          {"train.epochs", saved.train.epochs, now.train.epochs}}) {
      if (before == after) continue;
      if (!stretched.empty()) stretched += ", ";
      stretched.append(key).append(" ").append(std::to_string(before)).append(" -> ").append(std::to_string(after));
    }
  }
  if (!stretched.empty()) {
    stretched = std::string("resume: the learning-rate decay (train.lr_schedule ")
                    .append(ddp::lrDecayName(now.train.lrSchedule))
                    .append(", train.decay_steps 0: it ends at the run's last step) spans this run's length, which "
                            "changes (")
                    .append(stretched)
                    .append("), so the learning rate jumps at the resumed step; to continue the checkpoint's schedule, "
                            "set train.decay_steps to the checkpoint run's last step");
  }
  if (changes.empty()) return stretched;
  std::string list;
  for (const ConfigChange& c : changes) {
    if (!list.empty()) list += ", ";
    list.append(c.key).append(" ").append(c.saved).append(" -> ").append(c.now);
    if (c.key == "train.batch_size" && (saved.mode == Mode::kDp) != (now.mode == Mode::kDp)) {
      // ddp's is per rank, dp's the whole batch: 32 on 2 ranks -> 64 in dp is the same global batch.
      list.append(saved.mode == Mode::kDp ? " (the whole batch in the checkpoint's mode dp, per rank now)"
                                          : " (per rank in the checkpoint's mode, the whole batch in this mode dp)");
    }
  }
  std::string line = "resume: this run changes settings of the run that wrote the checkpoint (";
  line.append(path).append("), the checkpoint's -> this run's: ");
  line.append(list).append("; training continues with this run's values (resume with the checkpoint's, in its "
                           "run's config.resolved.yaml, to continue it unchanged)");
  return stretched.empty() ? line : line + "\n" + stretched;
}

}  // namespace ddp::worker
