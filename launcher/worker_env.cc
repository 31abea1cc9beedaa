#include "launcher/worker_env.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

extern char** environ;  // NOLINT: POSIX

namespace ddp::launcher {

EnvMap currentEnvironment() {
  EnvMap env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const size_t equals = text.find('=');
    if (equals == std::string::npos || equals == 0) continue;
    env.emplace(text.substr(0, equals), text.substr(equals + 1));
  }
  return env;
}

bool shouldDefaultOmpThreads(const LaunchOptions& options, const EnvMap& inherited) {
  return options.nprocPerNode > 1 && inherited.count("OMP_NUM_THREADS") == 0;
}

EnvMap workerEnvironment(const LaunchOptions& options, int localRank, int masterPort, const EnvMap& inherited) {
  EnvMap env = inherited;
  const std::string rank = std::to_string(options.globalRank(localRank));
  const std::string worldSize = std::to_string(options.worldSize());
  env["RANK"] = rank;
  env["LOCAL_RANK"] = std::to_string(localRank);
  env["WORLD_SIZE"] = worldSize;
  env["LOCAL_WORLD_SIZE"] = std::to_string(options.nprocPerNode);
  env["GROUP_RANK"] = std::to_string(options.nodeRank);
  env["GROUP_WORLD_SIZE"] = std::to_string(options.nnodes);
  // One role (--role, "default") spans the whole job, as in torchrun.
  env["ROLE_NAME"] = options.role;
  env["ROLE_RANK"] = rank;
  env["ROLE_WORLD_SIZE"] = worldSize;
  env["TORCHELASTIC_RUN_ID"] = options.runId;  // an elastic round sets its --rdzv_id
  env["MASTER_ADDR"] = options.masterAddr;
  env["MASTER_PORT"] = std::to_string(masterPort);
  // Restart attempt 0; restartPlan() raises both counters for each restart.
  env["TORCHELASTIC_RESTART_COUNT"] = "0";
  env["DDP_RESTART_COUNT"] = "0";
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(options.maxRestarts);
  // Our output relay already prefixes "[rank N] "; the worker leaves it out of its own logs.
  env["DDP_LAUNCH_PREFIXED"] = "1";
  if (!options.cudaVisibleDevices.empty()) {
    env["CUDA_VISIBLE_DEVICES"] = options.cudaVisibleDevices;  // local rank r takes the r-th (cuda:r)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID";                    // CUDA numbers GPUs as nvidia-smi does
  }
  // The worker cannot see the terminal through the relay's pipe: tell it whether there is one.
  if (inherited.count("DDP_PROGRESS") == 0) env["DDP_PROGRESS"] = options.consoleIsTerminal ? "bar" : "lines";
  if (shouldDefaultOmpThreads(options, inherited)) env["OMP_NUM_THREADS"] = "1";
  // LibTorch's own log lines (c10d socket retries with C++ stack traces and the like) would
  // bury the worker's one-line errors; only FATAL passes unless the user asks for more.
  // Debian's 1.13 logs through glog, the PyPI 2.x wheel through c10's own logger.
  // A Python worker gets torchrun's environment instead: PyTorch's own defaults (its NCCL watchdog's
  // timeout reports are LOG(ERROR) lines), and the NCCL error handling torchrun's agent asks for.
  if (options.workerRunsPython || isPythonInterpreter(options.worker)) {
    if (inherited.count("TORCH_NCCL_ASYNC_ERROR_HANDLING") == 0) env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1";
    return env;
  }
  if (inherited.count("GLOG_minloglevel") == 0) env["GLOG_minloglevel"] = "3";
  if (inherited.count("TORCH_CPP_LOG_LEVEL") == 0) env["TORCH_CPP_LOG_LEVEL"] = "FATAL";
  return env;
}

bool isPythonInterpreter(const std::string& worker) {
  const std::string name = worker.substr(worker.rfind('/') + 1);
  if (name.rfind("python", 0) != 0) return false;
  const std::string version = name.substr(6);  // "", "3", "3.11"
  return version.find_first_not_of("0123456789.") == std::string::npos;
}

bool workerRunsPython(const LaunchOptions& options, const std::string& resolvedPath) {
  const auto python = [](const std::string& word) {
    return isPythonInterpreter(word) || (word.size() > 3 && word.compare(word.size() - 3, 3, ".py") == 0);
  };
  if (options.workerRunsPython || python(options.worker)) return true;
  // A wrapper that starts Python: env python3 train.py, nsys profile python ..., uv run train.py.
  if (std::any_of(options.workerArgs.begin(), options.workerArgs.end(), python)) return true;
  // A script (not a program): its #! line names python, or a command it runs is one (exec python3
  // "$@", conda run -n env python x.py, uv run x.py). Comments and other words that merely contain
  // "python" (module load python/3.11, /opt/python/venv/bin/activate) do not count.
  std::ifstream in(resolvedPath, std::ios::binary);
  std::string head(64 * 1024, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  if (head.rfind("#!", 0) != 0) return false;
  std::istringstream lines(head);
  std::string line;
  std::getline(lines, line);
  if (line.find("python") != std::string::npos) return true;
  while (std::getline(lines, line)) {
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    for (char& c : line) {
      if (c == ';' || c == '&' || c == '|' || c == '"' || c == '\'') c = ' ';
    }
    std::istringstream words(line);
    for (std::string word; words >> word;) {
      if (python(word)) return true;
    }
  }
  return false;
}

namespace {

// Index in the interpreter's arguments just past the script, `-m module` or `-c command`, as
// CPython's getopt reads them: options first, clustered or not (-uX dev, -Wignore); c, m, W and
// X take a value (the rest of the cluster, else the next argument); `--` ends the options.
size_t pastPythonScript(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") return std::min(i + 2, args.size());      // `-- script.py`
    if (a == "-" || a.size() < 2 || a[0] != '-') return i + 1;  // the script (or `-` for stdin)
    if (a[1] == '-') {                                        // --long options
      if (a == "--check-hash-based-pycs") ++i;
      continue;
    }
    for (size_t j = 1; j < a.size(); ++j) {
      const char c = a[j];
      if (c != 'c' && c != 'm' && c != 'W' && c != 'X') continue;  // a flag without value
      const size_t valueAt = j + 1 < a.size() ? i : i + 1;
      if (c == 'c' || c == 'm') return std::min(valueAt + 1, args.size());
      i = valueAt;
      break;
    }
  }
  return args.size();
}

}  // namespace

std::vector<std::string> workerArguments(const LaunchOptions& options, int localRank) {
  std::vector<std::string> args = options.workerArgs;
  if (options.useEnv) return args;
  const std::string flag = "--local_rank=" + std::to_string(localRank);
  const size_t at = isPythonInterpreter(options.worker) ? pastPythonScript(args) : 0;
  args.insert(args.begin() + static_cast<std::ptrdiff_t>(at), flag);
  return args;
}

}  // namespace ddp::launcher
