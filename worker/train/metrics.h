// Rank 0's records: metrics.jsonl (one JSON object per logged step) and summary.json.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "common/no_follow.h"

namespace ddp::worker {

/// Appends one JSON object per line; flushed per record so a crash keeps what was logged.
class MetricsWriter {
 public:
  MetricsWriter() = default;  // disabled: on ranks other than 0
  /// `append`: continue the file of a resumed run instead of starting it anew.
  explicit MetricsWriter(const std::string& path, bool append = false);
  void write(const nlohmann::json& record);
  bool enabled() const { return out_.is_open(); }
  /// Whether the file it writes is no longer at its path (deleted, or another file put there).
  bool removed() const;

 private:
  std::string path_;
  FileId id_;
  std::ofstream out_;
};

struct TrainResult;
struct WorkerConfig;

/// The summary.json fields every training mode shares; callers add their own.
nlohmann::json trainingSummary(const WorkerConfig& config, const TrainResult& result, int worldSize,
                               const std::string& mode, const std::string& backend,
                               const std::string& device, int64_t globalBatch);

/// The closing log line of a training run.
void logDone(const TrainResult& result);

/// Writes `summary` pretty-printed, atomically.
void writeSummary(const std::string& path, const nlohmann::json& summary);

/// The "steps" a summary.json at `path` records; -1 when it is missing or unreadable.
int64_t summarySteps(const std::string& path);

}  // namespace ddp::worker
