#include "worker/config/startup_checks.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/Context.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/dir_lock.h"
#include "common/error.h"
#include "common/relative_path.h"
#include "ddp/checkpoint.h"
#include "ddp/files.h"
#include "ddp/launch_env.h"

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

// `path` quoted; a relative one with the directory it is taken from.
static std::string shownPath(const std::string& path) { return "'" + path + "'" + relativePathNote(path); }

// A file the run reads at start that is not there (or not readable for this user): one line that
// names the key, instead of the reader's "cannot open" later, after the group has formed.
static void requireReadable(const std::string& key, const std::string& path, const std::string& fix) {
  if (path.empty()) return;
  if (::access(path.c_str(), F_OK) != 0) {
    DDP_THROW(ConfigError, "config: '", key, "' is ", shownPath(path), ", which does not exist; ", fix);
  }
  if (!isDirectory(path) && ::access(path.c_str(), R_OK) != 0) {
    const int error = errno;
    DDP_THROW(ConfigError, "config: '", key, "': cannot read ", shownPath(path), " (", std::strerror(error),
              "); make it readable for this user, or copy it");
  }
}

bool resumeReplacesInitialWeights(const WorkerConfig& config) {
  if (config.resume.empty()) return false;
  return config.resume != "auto" || !listCheckpoints(checkpointDir(config)).empty();
}

void checkInputPaths(const WorkerConfig& config) {
  // A sharded checkpoint's directory (its manifest beside the rank files) is a model file too.
  const auto shardedCheckpoint = [](const std::string& path) {
    return std::filesystem::exists(std::filesystem::path(path) / "manifest.json");
  };
  const bool trains = config.mode != Mode::kEval && config.mode != Mode::kGenerate;
  if (config.resume != "auto") refuseSpecialFile("resume", config.resume, "a checkpoint file, or resume=auto");
  refuseSpecialFile("init.model_path", config.init.modelPath, "a model file torch.save or our export wrote");
  if (config.mode == Mode::kEval) {
    refuseSpecialFile("eval.model_path", config.eval.modelPath, "a model file torch.save or our export wrote");
  }
  if (config.mode == Mode::kGenerate) {
    refuseSpecialFile("generate.model_path", config.generate.modelPath, "a model file torch.save or our export wrote");
    if (isDirectory(config.generate.modelPath) && !shardedCheckpoint(config.generate.modelPath)) {
      DDP_THROW(ConfigError, "config: 'generate.model_path' is the directory '", config.generate.modelPath,
                "'; give the model file in it, e.g. ", config.generate.modelPath, "/model.pt");
    }
  }
  // A sharded checkpoint (train.sharding full / zero2) is a directory with its manifest.
  if (!config.resume.empty() && config.resume != "auto" && isDirectory(config.resume) &&
      !std::filesystem::exists(std::filesystem::path(config.resume) / "manifest.json")) {
    DDP_THROW(ConfigError, "config: 'resume' is the directory '", config.resume,
              "', not a checkpoint; give a checkpoint file in it (ckpt-<step>.pt) or a sharded checkpoint's "
              "directory (ckpt-<step>/ with its manifest.json), or resume=auto to take the newest valid one in "
              "checkpoint.dir");
  }
  const std::string modelFile = "give a model file (our export, a torch.save'd state dict or a checkpoint)";
  if (trains && config.resume != "auto") {
    requireReadable("resume", config.resume,
                    "give a checkpoint (ckpt-<step>.pt, or a sharded checkpoint's directory ckpt-<step>/), or "
                    "resume=auto to take the newest in checkpoint.dir (none there: start fresh)");
  }
  // Rank 0 alone reads init.model_path (and broadcasts it): on another node it need not exist; nor
  // when a resumed checkpoint replaces its weights.
  if (trains && launchEnv().rank == 0 && !resumeReplacesInitialWeights(config)) {
    requireReadable("init.model_path", config.init.modelPath, modelFile + ", or leave it empty to start from fresh weights");
  }
  if (config.mode == Mode::kEval) requireReadable("eval.model_path", config.eval.modelPath, modelFile);
  // Files a key names, read at start (a data set's own folder, data.root, is data: its reader names
  // what is missing in it).
  if (config.data.name == "tensors" && config.mode != Mode::kGenerate) {
    requireReadable("data.train_file", config.data.trainFile, "give a torch.save'd dict of images and labels");
    requireReadable("data.test_file", config.data.testFile, "give a torch.save'd dict of images and labels");
  }
  if (config.model.name == "torchscript") {
    requireReadable("model.path", config.model.path, "give a TorchScript file (torch.jit.script(model).save(path))");
  }
  if (config.mode == Mode::kGenerate) {
    requireReadable("generate.model_path", config.generate.modelPath,
                    modelFile + ", or leave it empty to sample from output.dir's export");
  }
  if (!config.init.modelPath.empty() && isDirectory(config.init.modelPath) && !shardedCheckpoint(config.init.modelPath)) {
    DDP_THROW(ConfigError, "config: 'init.model_path' is the directory '", config.init.modelPath,
              "'; give the model file in it, e.g. ", config.init.modelPath, "/model.pt");
  }
  if (config.mode == Mode::kEval && isDirectory(config.eval.modelPath) && !shardedCheckpoint(config.eval.modelPath)) {
    DDP_THROW(ConfigError, "config: 'eval.model_path' is the directory '", config.eval.modelPath,
              "'; give the model file in it, e.g. ", config.eval.modelPath, "/model.pt");
  }
}

// One job per output.dir and per checkpoint.dir: two jobs writing one directory would overwrite each
// other's outputs and remove each other's temporaries (and a fresh job with resume=auto would take
// the other's checkpoints).
static void lockForThisJob(const std::string& dir, const char* setting) {
  const std::string file = kJobLockFile;
  const std::string refused = dirLockRefusal(lockDirectory(dir, file), dir, file, setting);
  if (!refused.empty()) DDP_THROW(ConfigError, "config: '", setting, "' ", dir, refused);
}

// A fresh run saving among an earlier run's checkpoints: a later resume=auto would take whichever
// has the highest step (keep_last leaves the other run's alone, ddp::Checkpointer).
static void checkNoEarlierRun(const std::string& dir) {
  const std::vector<std::string> earlier = listCheckpoints(dir);
  if (earlier.empty()) return;
  const std::string newest = std::filesystem::path(earlier.back()).filename().string();
  if (launchEnv().restartCount > 0) {  // most likely this job's own, from before the restart
    spdlog::warn("checkpoint.dir {} holds {} (and {} more) but resume is unset: this restart trains from the "
                 "beginning; set resume=auto to continue from it", dir, newest, earlier.size() - 1);
    return;
  }
  DDP_THROW(ConfigError, "config: checkpoint.dir ", dir, " holds an earlier run's checkpoints (", earlier.size(),
            ", the newest ", newest, ") and this run starts fresh (resume is unset): its saves would mix with them, "
            "and a later resume=auto would take the newest of either run; use resume=auto to continue that run, "
            "another checkpoint.dir, or move them out");
}

// The directories checkOutputPaths made: the topmost missing one of each path it created.
static std::vector<std::string>& madeDirectories() {
  static std::vector<std::string> made;
  return made;
}

// makeDirectories(dir), remembering the topmost directory it will create.
static void makeOutputDirectory(const std::string& dir, const char* setting) {
  std::error_code ec;
  std::filesystem::path top;
  for (std::filesystem::path p = std::filesystem::absolute(dir, ec); !ec && !p.empty() && !std::filesystem::exists(p, ec);
       p = p.parent_path()) {
    top = p;
    if (p == p.parent_path()) break;
  }
  makeDirectories(dir, setting);
  if (!top.empty()) madeDirectories().push_back(top.string());
}

// Removes `dir` and the directories under it that are empty, deepest first, with rmdir(2): a
// directory that holds a file (or gets one meanwhile) stays, and nothing else is ever removed.
static void removeEmptyTree(const std::filesystem::path& dir) {
  std::error_code ec;
  std::vector<std::filesystem::path> below;
  for (auto e = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && e != std::filesystem::recursive_directory_iterator(); e.increment(ec)) {
    if (e->is_directory(ec) && !e->is_symlink(ec)) below.push_back(e->path());
  }
  for (auto it = below.rbegin(); it != below.rend(); ++it) ::rmdir(it->c_str());
  ::rmdir(dir.c_str());
}

void removeUnusedOutputDirs() {
  releaseDirectoryLocks();  // their lock files are the only files a refused run put there
  for (auto it = madeDirectories().rbegin(); it != madeDirectories().rend(); ++it) removeEmptyTree(*it);
  madeDirectories().clear();
}

void checkOutputPaths(const WorkerConfig& config) {
  makeOutputDirectory(config.output.dir, "output.dir");
  lockForThisJob(config.output.dir, "output.dir");
  probeFile(config.output.dir, config.mode == Mode::kEval ? "eval.json" : "summary.json", "output.dir",
            "set output.dir to a writable directory");
  if (config.mode != Mode::kEval) {
    probeFile(config.output.dir, config.output.exportName, "output.export", "use a shorter file name");
  }
  if (config.checkpoint.everySteps > 0 || config.checkpoint.everyEpochs > 0) {
    const std::string dir = checkpointDir(config);
    makeOutputDirectory(dir, "checkpoint.dir");
    lockForThisJob(dir, "checkpoint.dir");
    probeFile(dir, "ckpt-00000000.pt", "checkpoint.dir", "set checkpoint.dir to a writable directory");
    if (config.resume.empty()) checkNoEarlierRun(dir);
  } else if (std::filesystem::is_directory(checkpointDir(config))) {
    // Read by resume=auto, written by the checkpoint a stop signal saves: another job's saves would
    // race the one and prune the other's. A missing one is not made (the save on a signal makes and
    // locks it, ddp::Checkpointer).
    lockForThisJob(checkpointDir(config), "checkpoint.dir");
  }
}

void applyNumerics(const WorkerConfig& config) {
  if (config.deterministicAlgorithms) ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setBenchmarkCuDNN(config.cudnn.benchmark);
  at::globalContext().setDeterministicCuDNN(config.cudnn.deterministic);
  at::globalContext().setDeterministicAlgorithms(config.deterministicAlgorithms, /*warn_only=*/false);
}

}  // namespace ddp::worker
