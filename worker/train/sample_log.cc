#include "worker/train/sample_log.h"

#include <cstdlib>
#include <filesystem>

#include "common/error.h"
#include "common/no_follow.h"
#include "ddp/files.h"

namespace ddp::worker {

namespace {

std::string logPath(const std::string& dir, int rank) {
  return dir + "/samples_rank" + std::to_string(rank) + ".txt";
}

}  // namespace

SampleLog::SampleLog(const std::string& dir, int rank, int world, bool append) {
  makeDirectories(dir, "output.dir");
  path_ = logPath(dir, rank);
  const std::string& path = path_;
  if (const std::string why = claimFile(path, append); !why.empty()) {
    DDP_THROW(ConfigError, "config: 'output.sample_log': cannot write '", path, "': ", why);
  }
  if (!append && rank == 0) {
    // A fresh run's logs are its own: an earlier run with more ranks left files no rank writes now.
    for (int r = world;; ++r) {
      std::error_code ec;
      if (!std::filesystem::remove(logPath(dir, r), ec)) break;
    }
  }
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!out_) DDP_THROW(ConfigError, "config: 'output.sample_log': cannot write '", path, "'; fix output.dir");
  id_ = fileIdOf(path);
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  out_ << "# restart " << (restart != nullptr && *restart != '\0' ? restart : "0") << " world " << world << '\n'
       << std::flush;
}

bool SampleLog::removed() const { return fileIdOf(path_) != id_; }

void SampleLog::write(int64_t epoch, int64_t step, const std::vector<int64_t>& indices) {
  out_ << epoch << ' ' << step;
  for (int64_t i : indices) out_ << ' ' << i;
  out_ << '\n' << std::flush;
}

}  // namespace ddp::worker
