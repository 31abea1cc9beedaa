#include "worker/config/startup_checks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/error.h"
#include "libddp/checkpoint/atomic_file.h"

namespace ddp::worker {
namespace {

bool isDirectory(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

// Creates and removes `dir/name` as writeFileAtomic's temporary would be named (the longest name it uses).
void probeFile(const std::string& dir, const std::string& name, const std::string& key, const std::string& fix) {
  const std::string probe = dir + "/." + name + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int error = errno;
    const std::string shown = name.size() > 40 ? name.substr(0, 40) + "..." : name;
    // The length matters when the name is too long; for a permission error it is noise.
    const std::string length = error == ENAMETOOLONG ? " (" + std::to_string(name.size()) + " characters)" : "";
    DDP_THROW(ConfigError, "config: '", key, "': cannot create '", shown, "'", length, " in '", dir, "' (",
              std::strerror(error), "); ",
              error == ENAMETOOLONG ? fix : "make '" + dir + "' writable or choose another directory");
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace

// What `path` is when it exists but is neither a regular file nor a directory ("" otherwise):
// opening a named pipe nobody writes to blocks for ever.
static std::string specialFileKind(const std::string& path) {
  struct stat info {};
  if (path.empty() || ::stat(path.c_str(), &info) != 0 || S_ISREG(info.st_mode) || S_ISDIR(info.st_mode)) return "";
  if (S_ISFIFO(info.st_mode)) return "a named pipe";
  if (S_ISSOCK(info.st_mode)) return "a socket";
  return "a device";
}

static void refuseSpecialFile(const std::string& key, const std::string& path, const std::string& what) {
  const std::string kind = specialFileKind(path);
  if (!kind.empty()) {
    DDP_THROW(ConfigError, "config: '", key, "' is '", path, "', ", kind, ", not a file; give ", what);
  }
}

void checkInputPaths(const WorkerConfig& config) {
  if (config.resume != "auto") refuseSpecialFile("resume", config.resume, "a checkpoint file, or resume=auto");
  refuseSpecialFile("init.model_path", config.init.modelPath, "a model file torch.save or our export wrote");
  if (config.mode == Mode::kEval) {
    refuseSpecialFile("eval.model_path", config.eval.modelPath, "a model file torch.save or our export wrote");
  }
  if (!config.resume.empty() && config.resume != "auto" && isDirectory(config.resume)) {
    DDP_THROW(ConfigError, "config: 'resume' is the directory '", config.resume,
              "'; give a checkpoint file in it, or resume=auto to take the newest valid one in checkpoint.dir");
  }
  if (!config.init.modelPath.empty() && isDirectory(config.init.modelPath)) {
    DDP_THROW(ConfigError, "config: 'init.model_path' is the directory '", config.init.modelPath,
              "'; give the model file in it, e.g. ", config.init.modelPath, "/model.pt");
  }
  if (config.mode == Mode::kEval && isDirectory(config.eval.modelPath)) {
    DDP_THROW(ConfigError, "config: 'eval.model_path' is the directory '", config.eval.modelPath,
              "'; give the model file in it, e.g. ", config.eval.modelPath, "/model.pt");
  }
}

void checkOutputPaths(const WorkerConfig& config) {
  checkpoint::makeDirectories(config.output.dir, "output.dir");
  probeFile(config.output.dir, "summary.json", "output.dir", "set output.dir to a writable directory");
  if (config.mode != Mode::kEval) {
    probeFile(config.output.dir, config.output.exportName, "output.export", "use a shorter file name");
  }
  if (config.checkpoint.everySteps > 0 || config.checkpoint.everyEpochs > 0) {
    const std::string dir = checkpointDir(config);
    checkpoint::makeDirectories(dir, "checkpoint.dir");
    probeFile(dir, "ckpt-00000000.pt", "checkpoint.dir", "set checkpoint.dir to a writable directory");
  }
}

}  // namespace ddp::worker
