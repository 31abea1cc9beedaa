// worker: one rank of a data-parallel job. Started by ddp-launch (or torchrun,
// Slurm, mpirun) with the env contract; `worker config.yaml [key=value ...]`.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <torch/utils.h>

#include <nlohmann/json.hpp>

#include <malloc.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <thread>

#include "ddp/ddp.h"
#include "common/error.h"
#include "common/host_memory.h"
#include "worker/config/config.h"
#include "worker/config/config_agreement.h"
#include "worker/dp/dp_trainer.h"
#include "worker/report/memory_stats.h"
#include "worker/report/progress.h"
#include "worker/train/eval_mode.h"
#include "worker/train/generate_mode.h"
#include "worker/train/stop_signal.h"
#include "worker/train/metrics.h"
#include "worker/models/model_size.h"
#include "worker/report/rank_report.h"
#include "worker/config/startup_checks.h"
#include "worker/train/trainer.h"

namespace {

constexpr const char* kUsage =
    "usage: worker CONFIG.yaml [dotted.key=value ...]\n"
    "  Trains one rank of a data-parallel job; start it with\n"
    "  ddp-launch --nproc_per_node=N worker CONFIG.yaml [overrides]\n"
    "  e.g. worker configs/fmnist_cnn_ddp.yaml train.max_steps=50 output.dir=out/try\n"
    "       worker --config-keys   every key and its default (KEY<TAB>DEFAULT, YAML), for\n"
    "                              scripts/config_reference.py\n";

constexpr double kMiB = 1024.0 * 1024.0;

// What the out-of-memory line tells the user to shrink: the configured model's size keys.
std::string gSmallerModel = "a smaller model";
// A config that does not load fails every rank alike (the same file and overrides): under a launcher
// that collects the ranks' error files (ddp-launch, torchrun), only each host's first rank prints
// the line, the others record it for the launcher's summary (8 ranks printed it 8 times).
bool gConfigErrorRecordedOnly = false;

/// Mode eval and dp run one process: its group is a group of one (no network) on `device`.
ddp::ProcessGroup startGroupOfOne(const std::string& device, std::optional<int> legacyLocalRank) {
  ddp::InitOptions init;
  init.device = device;
  init.legacyLocalRank = legacyLocalRank;
  return ddp::initProcessGroup(init);
}

/// mode: dp — one process, the replicas on threads (CPU) or GPUs; no network.
int runDataParallel(const ddp::worker::WorkerConfig& config, std::optional<int> legacyLocalRank) {
  using namespace ddp::worker;
  if (config.threads > 0) torch::set_num_threads(static_cast<int>(config.threads));
  const dp::DpPlacement placement = dp::resolveDpPlacement(config);
  const Datasets data = loadDatasets(config.data, config.seed, splitsOf(config));
  // One process: its replicas share the master's weights and split the batch.
  checkTrainingFits(config, data.input, 1, 1, placement.devices.front().is_cpu(), ddp::memoryLimit());
  checkOutputPaths(config);
  std::vector<std::string> deviceNames;
  std::string deviceList;
  for (const auto& d : placement.devices) {
    deviceNames.push_back(d.str());
    deviceList += (deviceList.empty() ? "" : ", ") + d.str();
  }
  spdlog::info("mode dp: {} replicas on [{}], outputs gathered on {}, model {} data {} {}",
               placement.devices.size(), deviceList, placement.outputDevice.str(),
               config.model.name, config.data.name, describeSizes(data));
  ddp::makeDirectories(config.output.dir, "output.dir");

  // The training loop writes config.resolved.yaml once every check passed.
  dp::DpTrainer trainer(config, placement, startGroupOfOne(placement.devices.front().str(), legacyLocalRank));
  // From here on a SIGTERM finishes the step, saves a checkpoint and exits, as in mode ddp.
  installStopSignalHandlers();
  const dp::DpResult dpResult = trainer.run(data);
  const TrainResult& result = dpResult.train;
  if (result.stopSignal != 0) return 128 + result.stopSignal;  // its work saved
  if (result.outputsKept) return 0;  // resumed at the run's end: the outputs are that run's
  const double rssMb = static_cast<double>(dp::peakRssBytes()) / kMiB;
  nlohmann::json summary = trainingSummary(config, result, 1, "dp", "none", placement.devices.front().str(),
                                           config.train.batchSize * config.train.accumulateSteps);
  summary["dp_replicas"] = placement.devices.size();
  summary["dp_devices"] = deviceNames;
  summary["dp_output_device"] = placement.outputDevice.str();
  summary["peak_rss_mb"] = rssMb;
  summary["peak_rss_mb_per_process"] = {rssMb};
  if (!dpResult.peakAllocatedBytes.empty()) {
    std::vector<double> mb;
    for (auto b : dpResult.peakAllocatedBytes) mb.push_back(static_cast<double>(b) / kMiB);
    summary["cuda_peak_allocated_mb_per_device"] = mb;
  }
  std::vector<RankReport> replicas;  // "gpus": one entry per replica on a GPU ("rank" = replica)
  for (const auto& d : placement.devices) replicas.push_back(measureRank(d, true));
  if (const nlohmann::json gpus = gpuSummary(replicas); !gpus.empty()) summary["gpus"] = gpus;
  for (const auto& line : gpuReportLines(replicas)) spdlog::info("{}", line);
  writeSummary(config.output.dir + "/summary.json", summary);
  logDone(result);
  return 0;
}

// srun and mpirun leave OMP_NUM_THREADS unset (ddp-launch and torchrun set it), so every rank
// would use every core: with several ranks on this host and no threads setting, each gets its
// share of the cores this process may run on, said once per host.
int threadsPerLocalRank(const ddp::LaunchEnv& env, int worldSize) {
  if (std::getenv("OMP_NUM_THREADS") != nullptr || worldSize <= 1 || env.localWorldSize <= 1) return 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cores = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                                  : static_cast<int>(std::thread::hardware_concurrency());
  const int share = std::max(1, cores / env.localWorldSize);
  if (env.localRank == 0) {
    spdlog::info("threads: {} per rank ({} cores / {} ranks on this host; OMP_NUM_THREADS is unset under {})",
                 share, cores, env.localWorldSize, env.source);
  }
  return share;
}

// Mode eval, dp and single run one process; say so when the launcher started several.
void checkOneProcessModes(const ddp::worker::WorkerConfig& config, int worldSize) {
  using ddp::worker::Mode;
  if (worldSize <= 1) return;
  if (config.mode == Mode::kEval || config.mode == Mode::kGenerate) {
    DDP_THROW(ddp::ConfigError, "config: mode '", modeName(config.mode), "' runs one process, but WORLD_SIZE=", worldSize,
              "; start it with --nproc_per_node=1 (or run the worker directly)");
  }
  if (config.mode == Mode::kDp) {
    DDP_THROW(ddp::ConfigError, "config: mode 'dp' (DataParallel) is one process that drives all its replicas, "
              "but WORLD_SIZE=", worldSize, "; start it with --nproc_per_node=1 (dp.replicas or "
              "dp.device_ids pick the replicas), or use mode: ddp for one process per device");
  }
  if (config.mode == Mode::kSingle) {
    DDP_THROW(ddp::ConfigError, "config: mode 'single' runs one process, but WORLD_SIZE=", worldSize,
              "; use mode: ddp, or start with --nproc_per_node=1");
  }
}

/// The job's process group through the public API (ddp::initProcessGroup); between the rendezvous
/// and the group's creation every rank loads its data (one copy per host) and checks that the model
/// fits, so a missing data set or a model too large is one line on every rank before any group exists.
ddp::ProcessGroup startGroup(const ddp::worker::WorkerConfig& config, std::optional<int> legacyLocalRank,
                             ddp::worker::Datasets& data, ddp::HostCopyOrigin& dataOrigin) {
  using namespace ddp::worker;
  ddp::InitOptions init;
  // mode single needs no network whatever the backend; ddp with backend nccl gets an NCCL group even
  // for one rank (as init_process_group does), so a one-GPU job runs NCCL too.
  init.backend = config.mode == Mode::kSingle ? ddp::Backend::kAuto : config.backend;
  init.device = config.device;
  init.timeout = std::chrono::milliseconds(static_cast<int64_t>(config.comm.timeoutS * 1000));
  init.timeoutName = "comm.timeout_s";
  init.legacyLocalRank = legacyLocalRank;
  init.hangReportDir = std::filesystem::absolute(config.output.dir).string();
  init.checkCollectives = config.comm.checkCollectives;
  init.beforeGroup = [&](const ddp::GroupStart& start) {
    if (config.data.oneCopyPerHost && start.localSize() > 1) {
      data = loadDatasetsOncePerHost(config.data, config.seed, start, splitsOf(config), &dataOrigin);
    } else {
      data = loadDatasets(config.data, config.seed, splitsOf(config));
    }
    if (data.tokens) {
      data.input.classes = data::checkedVocabulary(*data.tokens, config.model);
      const std::vector<std::string> both = data::shardsInBoth(*data.tokens);
      if (!both.empty() && start.rank() == 0) {
        spdlog::warn("data: {} shard(s) ({}{}) match both data.train_files and data.val_files: the validation loss is "
                     "measured on training data; narrow the globs (e.g. train_*.bin and val_*.bin)",
                     both.size(), both.front(), both.size() > 1 ? ", ..." : "");
      }
    }
    checkTrainingFits(config, data.input, start.localSize(), start.size(), start.device().is_cpu(), ddp::memoryLimit());
  };
  return ddp::initProcessGroup(init);
}

/// Rank 0's summary.json from every rank's report (peak RSS, data copies, GPUs).
void writeDdpSummary(const ddp::worker::WorkerConfig& config, const ddp::worker::TrainResult& result,
                     const ddp::ProcessGroup& group, const std::vector<ddp::worker::RankReport>& reports) {
  using namespace ddp::worker;
  std::vector<double> rssMb, cudaMb, optimizerMb, parameterMb, gradientMb;
  int64_t copies = 0;
  for (const auto& r : reports) {
    rssMb.push_back(r.peakRssMb);
    optimizerMb.push_back(r.optimizerStateMb);
    parameterMb.push_back(r.parameterMb);
    gradientMb.push_back(r.gradientMb);
    cudaMb.push_back(r.gpu ? r.gpu->peakAllocatedMb : 0.0);
    copies += r.ownDataCopy ? 1 : 0;
  }
  nlohmann::json summary =
      trainingSummary(config, result, group.size(), modeName(config.mode),
                      group.backend() == ddp::Backend::kLocal ? "none" : ddp::backendName(group.backend()), group.device().str(),
                      config.train.batchSize * config.train.accumulateSteps * group.size());
  summary["peak_rss_mb"] = rssMb.front();
  summary["peak_rss_mb_per_process"] = rssMb;
  summary["data_copies"] = copies;
  summary["zero"] = config.train.zero && group.size() > 1;
  summary["sharding"] = shardingName(config.train.sharding);
  summary["optimizer_state_mb_per_process"] = optimizerMb;
  summary["parameter_mb_per_process"] = parameterMb;
  summary["gradient_mb_per_process"] = gradientMb;
  if (const nlohmann::json gpus = gpuSummary(reports); !gpus.empty()) {
    summary["gpus"] = gpus;
    summary["cuda_peak_allocated_mb_per_device"] = cudaMb;
  }
  for (const auto& line : gpuReportLines(reports)) spdlog::info("{}", line);
  writeSummary(config.output.dir + "/summary.json", summary);
  logDone(result);
}

/// mode ddp / single: one replica per process, gradients averaged over the group.
int runDistributed(const ddp::worker::WorkerConfig& config, const ddp::LaunchEnv& env,
                   std::optional<int> legacyLocalRank) {
  using namespace ddp::worker;
  if (config.threads > 0) {
    torch::set_num_threads(static_cast<int>(config.threads));
  } else if (const int share = threadsPerLocalRank(env, env.worldSize); share > 0) {
    torch::set_num_threads(share);
  }
  if (env.rank == 0) checkOutputPaths(config);  // rank 0 writes every output, so it checks first

  Datasets data;
  ddp::HostCopyOrigin dataOrigin = ddp::HostCopyOrigin::kLoaded;
  ddp::ProcessGroup group = startGroup(config, legacyLocalRank, data, dataOrigin);
  checkConfigAgreement(config, group);
  if (group.rank() == 0) {
    spdlog::info("mode {} world {} backend {} device {} model {} data {} {}",
                 modeName(config.mode), group.size(), ddp::backendName(group.backend()), group.device().str(),
                 config.model.name, config.data.name, describeSizes(data));
    ddp::makeDirectories(config.output.dir, "output.dir");  // the loop writes config.resolved.yaml
  }

  // From here on a SIGTERM finishes the step, saves a checkpoint and exits (before, it just kills).
  installStopSignalHandlers();
  Trainer trainer(config, group);
  const TrainResult result = trainer.run(data);
  if (result.stopSignal != 0) {
    group.destroy();
    return 128 + result.stopSignal;  // like a process killed by it, but with its work saved
  }
  if (result.outputsKept) {  // every rank knows it: no report to gather, no summary to rewrite
    group.destroy();
    return 0;
  }
  // Every rank's peak RSS, where its data came from and its GPU, to rank 0 (a collective).
  RankReport mine = measureRank(group.device(), dataOrigin != ddp::HostCopyOrigin::kMappedFromHostCopy);
  mine.optimizerStateMb = static_cast<double>(result.optimizerStateBytes) / (1024.0 * 1024.0);
  mine.parameterMb = static_cast<double>(result.parameterBytes) / (1024.0 * 1024.0);
  mine.gradientMb = static_cast<double>(result.gradientBytes) / (1024.0 * 1024.0);
  const std::vector<RankReport> reports = gatherRankReports(group, mine);
  if (group.rank() == 0) writeDdpSummary(config, result, group, reports);
  // No rank leaves while another still needs the store that rank 0 hosts.
  group.destroy();
  return 0;
}

int runWorker(std::vector<std::string> args) {
  using namespace ddp::worker;
  const auto legacyLocalRank = ddp::takeLegacyLocalRank(args);
  if (args.empty() || args[0] == "-h" || args[0] == "--help") {
    std::cout << kUsage;
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--config-keys") {  // the defaults live in WorkerConfig; docs/configuration.md shows them
    for (const auto& [key, value] : configValues(WorkerConfig{})) std::cout << key << '\t' << value << '\n';
    return 0;
  }
  // Read here for the log's rank and the mode checks; initProcessGroup reads it again (and takes
  // the job's token out of the environment).
  const ddp::LaunchEnv env = ddp::launchEnv(legacyLocalRank);
  const bool prefixed = std::getenv("DDP_LAUNCH_PREFIXED") != nullptr;
  spdlog::set_pattern(prefixed ? "%H:%M:%S.%e %^%l%$ %v"
                               : "%H:%M:%S.%e [rank " + std::to_string(env.rank) + "] %^%l%$ %v");
  if (underMpirun()) {  // a pseudo-terminal even when mpirun's output is a file: no colour codes in it
    for (auto& sink : spdlog::default_logger()->sinks()) {
      if (auto* colour = dynamic_cast<spdlog::sinks::stdout_color_sink_mt*>(sink.get())) {
        colour->set_color_mode(spdlog::color_mode::never);
      }
    }
  }

  const std::vector<std::string> overrides(args.begin() + 1, args.end());
  const char* errorFile = std::getenv("TORCHELASTIC_ERROR_FILE");
  gConfigErrorRecordedOnly = env.localRank != 0 && errorFile != nullptr && *errorFile != '\0';
  const WorkerConfig config = loadConfig(args[0], overrides);
  gSmallerModel = smallerModelKeys(config.model);
  checkInputPaths(config);
  applyNumerics(config);
  checkOneProcessModes(config, env.worldSize);  // every rank alike too (mode dp with 2: said once, not twice)
  gConfigErrorRecordedOnly = false;  // later errors may be this rank's own (its device, its files)
  if (config.mode == Mode::kEval) {
    ddp::ProcessGroup group = startGroupOfOne(config.device, legacyLocalRank);
    return runEvalMode(config, group);
  }
  if (config.mode == Mode::kGenerate) {
    ddp::ProcessGroup group = startGroupOfOne(config.device, legacyLocalRank);
    return runGenerateMode(config, group);
  }
  if (config.mode == Mode::kDp) return runDataParallel(config, legacyLocalRank);
  return runDistributed(config, env, legacyLocalRank);
}

}  // namespace

// LibTorch's CPU tensors come from malloc. glibc serves blocks above M_MMAP_THRESHOLD (128 KiB at
// start) with a fresh mmap and unmaps them on free, so every activation of every step faults its
// pages in again; glibc raises the threshold (to at most 32 MiB) only after the process frees a
// large mmapped block. A rank that maps its host's data copy never does, and trained 30% slower
// with 7x the page faults (perf stat, README command 1). Start where glibc would end: threshold
// 32 MiB, trim at 64 MiB. MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ from the user win.
void tuneMalloc() {
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
  if (std::getenv("MALLOC_TRIM_THRESHOLD_") == nullptr) ::mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

// The library's errors name its C++ options (ddp::DdpOptions::findUnusedParameters); the worker's
// user sets YAML keys, so its one line names those instead.
static std::string inConfigTerms(std::string what) {
  static const std::pair<const char*, const char*> kNames[] = {
      {"ddp::DdpOptions::findUnusedParameters = true", "comm.find_unused_parameters=true"},
      {"ddp::DdpOptions::findUnusedParameters", "comm.find_unused_parameters"},
      {"ddp::DdpOptions::compression", "comm.compression"},
      {"ddp::DdpOptions::bucketCapMb", "comm.bucket_cap_mb"},
      {"ddp::DdpOptions::firstBucketCapMb", "comm.first_bucket_mb"},
      {"ddp::DdpOptions::staticGraph", "comm.static_graph"},
      {"ddp::PowerSgdOptions::matrixApproximationRank", "comm.powersgd_rank"},
      {"ddp::PowerSgdOptions::startPowerSgdIter", "comm.powersgd_start_iter"},
      {"ddp::bf16CompressHook", "comm.hook bf16"},
      {"use fp16CompressHook", "use comm.hook: fp16"},
      {"ddp::CheckpointOptions::dir", "checkpoint.dir"},
      {"ddp::CheckpointOptions::keepLast", "checkpoint.keep_last"},
      {"load it with ddp::loadModel instead of resuming", "use init.model_path instead of resume"},
      {"check that the model is built as the one that wrote it (same layers and sizes)",
       "check model.name and the other model.* keys against the run that wrote it (its config.resolved.yaml)"},
  };
  for (const auto& [from, to] : kNames) {
    for (size_t at = what.find(from); at != std::string::npos; at = what.find(from, at + std::strlen(to))) {
      what.replace(at, std::strlen(from), to);
    }
  }
  return what;
}

// torchrun's TORCHELASTIC_ERROR_FILE (ddp-launch sets it too): the one-line error, in the JSON of
// Python's @record (torch.distributed.elastic.multiprocessing.errors), for the launcher's summary.
static void recordError(const std::string& line) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr || *path == '\0') return;
  const nlohmann::json data = {
      {"message",
       {{"message", line}, {"extraInfo", {{"timestamp", std::to_string(static_cast<long long>(std::time(nullptr)))}}}}}};
  std::ofstream(path) << data.dump();
}

// Prints the worker's one-line error (unless `recordOnly`), records it, and returns the exit code.
static int fail(const std::string& line, int code, bool recordOnly = false) {
  ddp::worker::removeUnusedOutputDirs();  // nothing written: nothing left behind
  if (!recordOnly) std::cerr << line << std::endl;
  recordError(line);
  return code;
}

int main(int argc, char** argv) {
  tuneMalloc();
  // LibTorch's own log lines (c10d's socket retries, with C++ stack traces) would bury the one-line
  // error; ddp-launch already turns them down, and so must a worker that srun, mpirun or a shell
  // starts. Only FATAL passes unless the user asks for more.
  ::setenv("TORCH_CPP_LOG_LEVEL", "FATAL", /*overwrite=*/0);
  c10::initLogging();  // applies TORCH_CPP_LOG_LEVEL (Python does this on import; C++ programs must)
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    return runWorker(std::move(args));
  } catch (const ddp::ConfigError& e) {
    return fail("worker: " + inConfigTerms(e.what()), 2, gConfigErrorRecordedOnly);
  } catch (const ddp::CheckpointsDamagedError& e) {
    // The user must move them out or repair one: exit 2, which ddp-launch does not restart into.
    return fail("worker: " + inConfigTerms(e.what()), 2);
  } catch (const c10::Error& e) {
    // LibTorch's own errors: the message without its C++ backtrace, on one line.
    std::string what = inConfigTerms(e.what_without_backtrace());
    what = what.substr(0, what.find('\n'));
    if (what.find("Expected more than 1 value per channel when training") != std::string::npos) {
      // BatchNorm in training on a batch of one sample: the epoch's last batch of a rank, mostly.
      what += " (a batch of one sample reached a BatchNorm layer in training: train.batch_size 1, a rank's last "
              "batch of the epoch holding 1 sample, or mode dp's last part of a batch (torch.chunk parts of ceil(batch / "
              "replicas) rows, as nn.DataParallel: 7 over 3 replicas is 3, 3, 1); choose a train.batch_size (or "
              "data.train_limit) that gives every part at least 2)";
    }
    const bool outOfMemory = dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr ||
                             what.find("can't allocate memory") != std::string::npos;
    return fail(std::string("worker: ") + (outOfMemory ? "out of memory: " : "") + what +
                    (outOfMemory ? "; use " + gSmallerModel + " or a smaller train.batch_size" : ""),
                1);
  } catch (const std::bad_alloc&) {
    return fail("worker: out of memory; use " + gSmallerModel + " or a smaller train.batch_size", 1);
  } catch (const std::exception& e) {
    std::string what = inConfigTerms(e.what());
    what = what.substr(0, what.find("\nException raised from"));
    // LibTorch's allocator error relayed by another rank (the host's data copy) reads as rank 0's.
    const bool outOfMemory = what.find("can't allocate memory") != std::string::npos;
    return fail(std::string("worker: ") + (outOfMemory ? "out of memory: " : "") + what +
                    (outOfMemory ? "; use " + gSmallerModel + " or a smaller train.batch_size" : ""),
                1);
  }
}
