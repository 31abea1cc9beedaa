#include "worker/train/trainer.h"

#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>
#include <torch/utils.h>

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <optional>

#include "common/error.h"
#include "common/temp_dir.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/checkpoint.h"
#include "ddp/files.h"
#include "ddp/state_dict.h"
#include "worker/config/startup_checks.h"
#include "worker/models/sharded_units.h"
#include "worker/train/fully_sharded.h"
#include "worker/train/training_loop.h"

namespace ddp::worker {
namespace {

// DDP's engine (the public API's DdpEngine) from the config: the bucketed Reducer or the flat
// all-reduce (comm.reducer), rank 0's buffers before each step's first forward
// (comm.broadcast_buffers). None for a group of one: nothing to average.
std::shared_ptr<CommHook> makeHook(const CommConfig& config) {
  if (config.hook == "fp16") return fp16CompressHook();
  if (config.hook == "bf16") return bf16CompressHook();
  if (config.hook == "powersgd") return powerSgdHook(config.powersgd);
  return nullptr;
}

std::unique_ptr<DdpEngine> makeEngine(const CommConfig& config, const ProcessGroup& group, torch::nn::Module& module,
                                      const std::shared_ptr<CommHook>& hook) {
  if (group.size() == 1 && !config.ddp.syncOnOneRank) return nullptr;
  DdpOptions options = config.ddp;
  options.commHook = hook;
  return std::make_unique<DdpEngine>(module, group, options);
}

// mode ddp / single: this process's replica; gradients averaged over the group by the engine.
class DdpParallelism final : public Parallelism {
 public:
  DdpParallelism(const WorkerConfig& config, const ProcessGroup& group, torch::nn::AnyModule& model)
      : config_(config), group_(group), device_(group.device()), model_(model), hook_(makeHook(config.comm)) {
    if (config.train.cudaGraph && device_.is_cuda()) {
      // The engine's gradient accumulators record the stream current at their creation, and
      // backward runs them (and the reducer's hooks) there: the graph's stream, or the capture
      // would reach the legacy default stream ("operation would make the legacy stream depend on a
      // capturing blocking stream", seen on an H200).
      graph_ = std::make_unique<CudaGraph>(device_);
      graph_->warmUp([&] { engine_ = makeEngine(config.comm, group, *model.ptr(), hook_); });
    } else {
      engine_ = makeEngine(config.comm, group, *model.ptr(), hook_);
    }
  }
  CudaGraph* cudaGraph() override { return graph_.get(); }

  void describe(TrainResult& result) const override {
    if (const auto* psgd = dynamic_cast<const PowerSgdHook*>(hook_.get())) {
      const PowerSgdHook::Stats stats = psgd->compressionStats();
      result.gradientElements = stats.elementsBefore;
      result.gradientElementsSent = stats.elementsAfter;
    }
  }

  torch::nn::Module& module() override { return *model_.ptr(); }
  ProcessGroup& group() override { return group_; }
  c10::Device lossDevice() const override { return device_; }
  data::LoaderOptions loading(int64_t epoch, bool training) const override {
    data::LoaderOptions o = loaderOptions(config_.data, device_, config_.seed, epoch);
    if (!training) o.augment = {};
    return o;
  }
  at::Tensor forward(const at::Tensor& input, bool lastMicroBatch) override {
    const at::Tensor x = config_.train.channelsLast && input.dim() == 4 ? input.contiguous(at::MemoryFormat::ChannelsLast)
                                                                        : input;
    if (!engine_) return model_.forward(x);
    // Only the last micro-batch's backward communicates (DDP's no_sync for the others).
    std::optional<DdpEngine::NoSync> noSync;
    if (!lastMicroBatch) noSync.emplace(*engine_);
    engine_->beforeForward();
    at::Tensor output = model_.forward(x);
    engine_->afterForward({output});
    return output;
  }
  void backwardWithoutBatch(bool lastMicroBatch) override {
    if (!engine_) return;  // a group of one: every batch is this rank's
    std::optional<DdpEngine::NoSync> noSync;
    if (!lastMicroBatch) noSync.emplace(*engine_);
    engine_->backwardWithoutBatch();
  }
  bool lossNeedsAverage() const override { return engine_ != nullptr; }
  void zeroGrad(const std::vector<at::Tensor>& params) override {
    if (engine_) engine_->zeroGrad();
    else Parallelism::zeroGrad(params);
  }
  EvalCounts evaluate(const data::SampleSource& test) override {
    return worker::evaluate(model_, test, device_, config_.eval.batchSize, group_, loading(0, false));
  }

 private:
  const WorkerConfig& config_;
  ProcessGroup group_;
  c10::Device device_;
  torch::nn::AnyModule& model_;
  std::shared_ptr<CommHook> hook_;  // comm.hook (null: the built-in all-reduce)
  std::unique_ptr<CudaGraph> graph_;  // train.cuda_graph, before the engine (destroyed after it)
  std::unique_ptr<DdpEngine> engine_;
};

}  // namespace

[[noreturn]] void throwDiverged(const WorkerConfig& config, const std::string& what) {
  DDP_THROW(Error, "training diverged: ", what, "; lower train.lr (", config.train.lr,
            ") or check the data; the checkpoints in ", checkpointDir(config),
            " (if any) hold the last good state (resume=auto)");
}

void exportTrainedModel(const WorkerConfig& config, const std::map<std::string, at::Tensor>& state,
                        const std::string& path) {
  try {
    saveStateDict(state, path);
    return;
  } catch (const CheckpointError& e) {
    namespace fs = std::filesystem;
    const std::string name = fs::path(path).filename().string() + ".rescued";
    std::error_code ec;
    const std::string tmp = temporaryRoot();
    for (const std::string& place : {checkpointDir(config), tmp}) {
      if (place.empty()) continue;
      std::string dir = place;
      if (place == tmp) {
        // A directory of our own (mode 0700): a fixed name in a shared /tmp could be read by other
        // users (the trained model) or taken by them first.
        std::string made = tmp + "/ddp-rescued-XXXXXX";
        if (::mkdtemp(made.data()) == nullptr) continue;
        dir = made;
      }
      const std::string rescue = (fs::path(dir) / name).string();
      if (fs::weakly_canonical(rescue, ec) == fs::weakly_canonical(path, ec)) continue;
      try {
        makeDirectories(dir, "checkpoint.dir");
        saveStateDict(state, rescue);
      } catch (const Error&) {
        if (dir != place) fs::remove_all(dir, ec);
        continue;
      }
      DDP_THROW(CheckpointError, "export failed: ", e.what(), "; the trained model was saved to '", rescue,
                "' instead (load it like model.pt); free space or fix output.dir and move it there");
    }
    const auto saved = listCheckpoints(checkpointDir(config));
    DDP_THROW(CheckpointError, "export failed: ", e.what(), "; no other place took the model either (",
              checkpointDir(config), ", ", tmp, ")",
              saved.empty() ? std::string("; no training checkpoint was saved: set checkpoint.every_steps to keep one")
                            : "; the newest training checkpoint is '" + saved.back() +
                                  "': free space, then resume=" + saved.back() + " to redo only the steps after it");
  }
}


Trainer::Trainer(const WorkerConfig& config, ProcessGroup group) : config_(config), group_(std::move(group)) {}

TrainResult Trainer::run(const Datasets& data) {
  // Same seed everywhere, then rank 0's values win: replicas start bit-identical.
  torch::manual_seed(config_.seed);
  auto model = makeModel(config_.model, data.input, &group_);
  auto& module = *model.ptr();
  module.to(group_.device());
  if (config_.train.channelsLast) {
    // Before DDP makes its bucket views, which then keep these strides (no copy per step).
    c10::NoGradGuard noGrad;
    for (auto& p : module.parameters()) {
      if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
    }
    for (auto& b : module.buffers()) {
      if (b.dim() == 4) b.set_data(b.contiguous(at::MemoryFormat::ChannelsLast));
    }
  }
  // init.model_path: rank 0 reads the file (the others need not see it), the broadcast hands its
  // weights to every rank. Not when a checkpoint will replace them (rank 0 alone decides: the
  // broadcast is the same either way).
  if (group_.rank() == 0 && !config_.init.modelPath.empty()) {
    if (resumeReplacesInitialWeights(config_)) {
      spdlog::info("init.model_path {} not read: the resumed checkpoint's weights replace it", config_.init.modelPath);
    } else {
      loadModelWeights(module, config_.init.modelPath);
      spdlog::info("initial weights from {}", config_.init.modelPath);
    }
  }
  if (config_.train.activationCheckpointing) {
    auto* units = dynamic_cast<ShardedUnits*>(&module);
    if (units == nullptr) {
      DDP_THROW(ConfigError, "config: 'train.activation_checkpointing' recomputes a model's units, and model '",
                config_.model.name, "' has none; set it to false");
    }
    units->setActivationCheckpointing(true);
    if (group_.rank() == 0) {
      spdlog::info("train.activation_checkpointing: the {} units of model '{}' recompute their activations in "
                   "backward", units->unitModules().size(), config_.model.name);
    }
  }
  if (config_.train.sharding == Sharding::kFull || config_.train.sharding == Sharding::kZero2) {
    FullyShardedParallelism parallelism(config_, group_, model, data.input);
    return runTrainingLoop(config_, data, parallelism, group_.device());
  }
  DdpParallelism parallelism(config_, group_, model);
  return runTrainingLoop(config_, data, parallelism, group_.device());
}

}  // namespace ddp::worker
