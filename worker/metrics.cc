#include "worker/metrics.h"

#include "common/error.h"
#include "worker/atomic_file.h"

namespace ddp::worker {

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : out_(path, append ? std::ios::app : std::ios::trunc) {
  if (!out_) DDP_THROW(ConfigError, "output: cannot write '", path, "'; set output.dir to a writable directory");
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  out_ << record.dump() << '\n';
  out_.flush();
}

void writeSummary(const std::string& path, const nlohmann::json& summary) {
  writeFileAtomic(path, summary.dump(2) + "\n");
}

}  // namespace ddp::worker
