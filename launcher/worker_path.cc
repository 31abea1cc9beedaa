#include "launcher/worker_path.h"

#include <cerrno>
#include <algorithm>
#include <cstring>

#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"

namespace ddp::launcher {
namespace {

enum class Check { kOk, kMissing, kDirectory, kNotExecutable };

Check check(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return Check::kMissing;
  if (S_ISDIR(info.st_mode)) return Check::kDirectory;
  if (::access(path.c_str(), X_OK) != 0) return Check::kNotExecutable;
  return Check::kOk;
}

}  // namespace

std::string resolveWorkerPath(const std::string& worker, const std::string& pathEnv) {
  if (worker.find('/') != std::string::npos) {
    switch (check(worker)) {
      case Check::kOk:
        return worker;
      case Check::kMissing:
        DDP_THROW(ConfigError, "worker '", worker, "' not found (", std::strerror(ENOENT),
                  "); give the path to the worker program, e.g. ./build/worker");
      case Check::kDirectory:
        DDP_THROW(ConfigError, "worker '", worker, "' is a directory; give the program inside it, e.g. ",
                  worker, (worker.back() == '/' ? "" : "/"), "worker");
      case Check::kNotExecutable: {
        const std::string ext = worker.substr(std::min(worker.size(), worker.rfind('.') == std::string::npos
                                                                          ? worker.size() : worker.rfind('.')));
        if (ext == ".yaml" || ext == ".yml" || ext == ".json") {  // the worker left out before its config
          DDP_THROW(ConfigError, "worker '", worker, "' is a config file, not a program; name the worker program "
                    "first and give it the config, e.g. ddp-launch ... ./build/worker ", worker);
        }
        DDP_THROW(ConfigError, "worker '", worker, "' is not executable; chmod +x it, or name its "
                  "interpreter first, e.g. ddp-launch ... /bin/sh ", worker);
      }
    }
  }
  // execvp's rule: an empty PATH entry means the current directory.
  bool sawNonExecutable = false;
  size_t start = 0;
  while (start <= pathEnv.size()) {
    size_t end = pathEnv.find(':', start);
    if (end == std::string::npos) end = pathEnv.size();
    std::string dir = pathEnv.substr(start, end - start);
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + worker;
    const Check result = check(candidate);
    if (result == Check::kOk) return candidate;
    sawNonExecutable = sawNonExecutable || result == Check::kNotExecutable;
    start = end + 1;
  }
  if (sawNonExecutable) {
    DDP_THROW(ConfigError, "worker '", worker, "' was found on PATH but is not executable; chmod +x it");
  }
  DDP_THROW(ConfigError, "worker '", worker, "' not found on PATH; give its path, e.g. ./", worker);
}

}  // namespace ddp::launcher
