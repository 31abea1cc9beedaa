#include "worker/dp/dp_trainer.h"

#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <set>
#include <string>

#include "common/error.h"
#include "ddp/checkpoint.h"
#include "ddp/cuda.h"
#include "worker/config/startup_checks.h"
#include "worker/data/batch_loader.h"
#include "worker/dp/data_parallel.h"
#include "worker/report/memory_stats.h"
#include "worker/train/training_loop.h"

namespace ddp::worker::dp {
namespace {

std::string visibleDevicesNote() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return std::string("CUDA_VISIBLE_DEVICES=") + (visible ? visible : "<unset>");
}

}  // namespace

DpPlacement resolveDpPlacement(const WorkerConfig& config) {
  const auto& dp = config.dp;
  const int visibleGpus = config.device == "cpu" ? 0 : cudaDeviceCount();
  const bool haveCuda = visibleGpus > 0;
  const bool useCuda = config.device == "cuda" || (config.device == "auto" && haveCuda);
  DpPlacement p;
  if (!useCuda) {
    if (!dp.deviceIds.empty()) {
      DDP_THROW(ConfigError, "config: 'dp.device_ids' names GPUs, but this dp run is on CPU (device: ",
                config.device, ", ", haveCuda ? "GPUs visible" : "no GPU visible",
                "); on CPU set dp.replicas instead");
    }
    p.devices.assign(static_cast<std::size_t>(dp.replicas), c10::Device(c10::kCPU));
    p.outputDevice = c10::Device(c10::kCPU);
    return p;
  }
  if (!haveCuda) {
    DDP_THROW(ConfigError, "config: device 'cuda' but no GPU is visible to this process (or LibTorch "
              "was built without CUDA); use device: cpu or auto");
  }
  const auto count = static_cast<int64_t>(visibleGpus);
  std::vector<int64_t> ids = dp.deviceIds;
  if (ids.empty()) {
    for (int64_t i = 0; i < count; ++i) ids.push_back(i);
  }
  std::set<int64_t> seen;
  for (auto id : ids) {
    if (id >= count) {
      DDP_THROW(ConfigError, "config: 'dp.device_ids' has GPU ", id, " but only ", count,
                " GPU(s) are visible (", visibleDevicesNote(), "); ids are logical, 0..", count - 1,
                ", counted after CUDA_VISIBLE_DEVICES, as in PyTorch");
    }
    if (!seen.insert(id).second) {
      DDP_THROW(ConfigError, "config: 'dp.device_ids' lists GPU ", id, " twice; each GPU holds one replica");
    }
    p.devices.emplace_back(c10::kCUDA, static_cast<c10::DeviceIndex>(id));
  }
  const int64_t out = dp.outputDevice < 0 ? ids.front() : dp.outputDevice;
  if (out >= count) {
    DDP_THROW(ConfigError, "config: 'dp.output_device' is GPU ", out, " but only ", count,
              " GPU(s) are visible (", visibleDevicesNote(), "); use a logical id 0..", count - 1,
              " or -1 for device_ids[0]");
  }
  p.outputDevice = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(out));
  return p;
}

namespace {

// mode dp: one process; DataParallel scatters each batch over the replicas and gathers the outputs
// on the output device, where the one loss is computed (nn.DataParallel).
class DpParallelism final : public Parallelism {
 public:
  DpParallelism(const WorkerConfig& config, const DpPlacement& placement, ProcessGroup group, torch::nn::AnyModule& model)
      : config_(config), placement_(placement), group_(std::move(group)), model_(model), dp_(model, dpOptions(placement)) {}

  torch::nn::Module& module() override { return *model_.ptr(); }
  ProcessGroup& group() override { return group_; }
  c10::Device lossDevice() const override { return placement_.outputDevice; }
  data::LoaderOptions loading(int64_t epoch, bool training) const override {
    // Batches stay on the CPU (DataParallel scatters them), page-locked when the replicas are GPUs.
    data::LoaderOptions o = loaderOptions(config_.data, placement_.devices.front(), config_.seed, epoch);
    o.device = c10::Device(c10::kCPU);
    o.pinOnCpu = placement_.devices.front().is_cuda();
    if (!training) o.augment = {};
    return o;
  }
  at::Tensor forward(const at::Tensor& x, bool /*lastMicroBatch*/) override { return dp_.forward(x); }
  EvalCounts evaluate(const data::SampleSource& test) override {
    c10::NoGradGuard noGrad;
    module().eval();
    const int64_t n = test.size();
    int64_t correct = 0;
    const auto loader = test.loader(data::contiguousBatches(0, n, config_.eval.batchSize), loading(0, false));
    int64_t seen = 0;  // streamed with data.skip_bad_images: a bad image is left out of its batch
    for (std::size_t k = 0; k < loader->size(); ++k) {
      const data::Batch b = loader->next();
      correct += dp_.forward(b.images).argmax(1).eq(b.labels.to(placement_.outputDevice)).sum().item<int64_t>();
      seen += b.labels.size(0);
    }
    return EvalCounts{correct, seen};
  }
  std::string progressNote() const override { return " (" + std::to_string(dp_.lastReplicasUsed()) + " replicas)"; }
  // Each replica draws from its own GPU's generator (dropout): checkpoints keep every one of them.
  std::vector<c10::Device> cudaGenerators() const override {
    return placement_.devices.front().is_cuda() ? placement_.devices : std::vector<c10::Device>{};
  }

 private:
  static DataParallelOptions dpOptions(const DpPlacement& placement) {
    DataParallelOptions o;
    o.devices = placement.devices;
    o.outputDevice = placement.outputDevice;
    return o;
  }
  const WorkerConfig& config_;
  const DpPlacement& placement_;
  ProcessGroup group_;
  torch::nn::AnyModule& model_;
  DataParallel dp_;
};

}  // namespace

DpTrainer::DpTrainer(const WorkerConfig& config, DpPlacement placement, ProcessGroup group)
    : config_(config), placement_(std::move(placement)), group_(std::move(group)) {}

DpResult DpTrainer::run(const Datasets& data) {
  torch::manual_seed(config_.seed);
  auto model = makeModel(config_.model, data.input);
  auto& module = *model.ptr();
  if (!config_.init.modelPath.empty() && resumeReplacesInitialWeights(config_)) {
    spdlog::info("init.model_path {} not read: the resumed checkpoint's weights replace it", config_.init.modelPath);
  } else if (!config_.init.modelPath.empty()) {
    loadModel(module, config_.init.modelPath);
    spdlog::info("initial weights from {}", config_.init.modelPath);
  }
  module.to(placement_.devices.front());  // DataParallel wants the master on device_ids[0]
  DpParallelism parallelism(config_, placement_, group_, model);
  // The master is the plain model: its export has the same keys as a single or DDP run.
  DpResult out;
  out.train = runTrainingLoop(config_, data, parallelism, placement_.devices.front());
  for (const auto& d : placement_.devices) {
    if (d.is_cuda()) out.peakAllocatedBytes.push_back(cudaMaxMemoryAllocated(d));
  }
  return out;
}

}  // namespace ddp::worker::dp
