#include "worker/train/sample_log.h"

#include <cstdlib>

#include "common/error.h"
#include "common/no_follow.h"
#include "ddp/files.h"

namespace ddp::worker {

SampleLog::SampleLog(const std::string& dir, int rank, int world) {
  makeDirectories(dir, "output.dir");
  const std::string path = dir + "/samples_rank" + std::to_string(rank) + ".txt";
  if (const std::string why = claimFile(path, /*append=*/true); !why.empty()) {
    DDP_THROW(ConfigError, "config: 'output.sample_log': cannot write '", path, "': ", why);
  }
  out_.open(path, std::ios::app);
  if (!out_) DDP_THROW(ConfigError, "config: 'output.sample_log': cannot write '", path, "'; fix output.dir");
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  out_ << "# restart " << (restart != nullptr && *restart != '\0' ? restart : "0") << " world " << world << '\n'
       << std::flush;
}

void SampleLog::write(int64_t epoch, int64_t step, const std::vector<int64_t>& indices) {
  out_ << epoch << ' ' << step;
  for (int64_t i : indices) out_ << ' ' << i;
  out_ << '\n' << std::flush;
}

}  // namespace ddp::worker
