// What the bad-input tests share: the job's config, a case's scratch directory and ports, the
// token file of the multi-node cases, and the check that no process outlived the launcher.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <ios>
#include <iterator>
#include <string>

namespace ddp::bad_input {

namespace fs = std::filesystem;

inline const std::string kConfig = std::string(DDP_SOURCE_DIR) + "/configs/synthetic_mlp.yaml";

struct Fixture {
  std::string dir;   // the case's scratch directory; output.dir is dir/out
  int heldPort = 0;  // a port some other program listens on
  int deadPort = 0;  // a port nobody listens on
};

// A token file for the multi-node cases (the nodes of a job share one), with `mode`.
inline std::string tokenFile(const Fixture& f, mode_t mode = 0600) {
  const std::string path = f.dir + "/job.token";
  std::ofstream(path) << "bad-input-job-token-0123456789\n";
  ::chmod(path.c_str(), mode);
  return path;
}

/// Processes whose command line mentions `marker` (our unique scratch dir).
inline int processesMentioning(const std::string& marker) {
  int count = 0;
  for (const auto& p : fs::directory_iterator("/proc")) {
    const std::string name = p.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd;
    try {
      std::ifstream in(p.path() / "cmdline");
      cmd.assign(std::istreambuf_iterator<char>(in), {});
    } catch (const std::ios_base::failure&) {
      continue;  // it exited while read (ESRCH, which libstdc++'s filebuf throws): not there any more
    }
    if (cmd.find(marker) != std::string::npos && std::to_string(::getpid()) != name) ++count;
  }
  return count;
}

}  // namespace ddp::bad_input
