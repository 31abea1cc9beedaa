#include "worker/config/startup_checks.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/Context.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/error.h"
#include "ddp/files.h"

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
              error == ENAMETOOLONG ? fix
              : error == ENOSPC     ? "free space or inodes (df -i) on its file system, or choose another directory"
                                    : "make '" + dir + "' writable or choose another directory");
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

// One job per output.dir: two jobs writing one directory would overwrite each other's outputs and
// remove each other's temporaries. An flock held for the life of this process (released by the
// kernel when it ends, however it ends); the file names the holder.
static void lockOutputDir(const std::string& dir) {
  static int held = -1;
  if (held >= 0) return;
  const std::string path = dir + "/.ddp-launch.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;  // a read-only place fails its own probe with the reason
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char owner[32] = {};
    const ssize_t n = ::pread(fd, owner, sizeof owner - 1, 0);
    ::close(fd);
    std::string pid = n > 0 ? std::string(owner, static_cast<size_t>(n)) : std::string("?");
    pid = pid.substr(0, pid.find('\n'));
    DDP_THROW(ConfigError, "config: 'output.dir' ", dir, " is in use by another job (pid ", pid, " holds ", path,
              "); give each job its own output.dir");
  }
  const std::string mine = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) == 0) (void)::pwrite(fd, mine.data(), mine.size(), 0);
  held = fd;
}

void checkOutputPaths(const WorkerConfig& config) {
  makeDirectories(config.output.dir, "output.dir");
  lockOutputDir(config.output.dir);
  probeFile(config.output.dir, "summary.json", "output.dir", "set output.dir to a writable directory");
  if (config.mode != Mode::kEval) {
    probeFile(config.output.dir, config.output.exportName, "output.export", "use a shorter file name");
  }
  if (config.checkpoint.everySteps > 0 || config.checkpoint.everyEpochs > 0) {
    const std::string dir = checkpointDir(config);
    makeDirectories(dir, "checkpoint.dir");
    probeFile(dir, "ckpt-00000000.pt", "checkpoint.dir", "set checkpoint.dir to a writable directory");
  }
}

void applyNumerics(const WorkerConfig& config) {
  if (config.deterministicAlgorithms) ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setBenchmarkCuDNN(config.cudnn.benchmark);
  at::globalContext().setDeterministicCuDNN(config.cudnn.deterministic);
  at::globalContext().setDeterministicAlgorithms(config.deterministicAlgorithms, /*warn_only=*/false);
}

}  // namespace ddp::worker
