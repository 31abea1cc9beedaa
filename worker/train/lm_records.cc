#include "worker/train/lm_records.h"

#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "common/error.h"
#include "ddp/autocast.h"
#include "ddp/cuda.h"
#include "worker/train/loss.h"

namespace ddp::worker {

double knownPeakFlops(const std::string& gpuName) {
  // Dense bf16 tensor-core peaks from the vendors' data sheets (nanoGPT uses the A100's 312e12).
  static const std::pair<const char*, double> kPeaks[] = {
      {"H200", 989e12}, {"H100 PCIe", 756e12}, {"H100", 989e12}, {"A100", 312e12},
      {"A10G", 70e12},  {"L40S", 362e12},      {"L4", 121e12},   {"RTX 4090", 165e12},
  };
  for (const auto& [name, peak] : kPeaks) {
    if (gpuName.find(name) != std::string::npos) return peak;
  }
  return 0;
}

std::unique_ptr<LanguageModelRecords> LanguageModelRecords::make(const WorkerConfig& config, const Datasets& data,
                                                                 torch::nn::Module& module, ProcessGroup& group,
                                                                 c10::Device device,
                                                                 std::function<at::Tensor(const at::Tensor&)> forward) {
  auto* gpt = dynamic_cast<GptImpl*>(&module);
  if (gpt == nullptr || !data.tokens) return nullptr;
  Gpt holder(std::dynamic_pointer_cast<GptImpl>(gpt->shared_from_this()));
  return std::unique_ptr<LanguageModelRecords>(new LanguageModelRecords(config, data, holder, group, device, std::move(forward)));
}

LanguageModelRecords::LanguageModelRecords(const WorkerConfig& config, const Datasets& data, Gpt model,
                                           ProcessGroup& group, c10::Device device,
                                           std::function<at::Tensor(const at::Tensor&)> forward)
    : config_(config), model_(std::move(model)), forward_(std::move(forward)), group_(group), device_(device),
      blockSize_(config.model.blockSize), val_(data.tokens->val) {
  peakFlops_ = config.output.peakFlops;
  if (peakFlops_ <= 0 && device.is_cuda()) {
    if (const auto report = gpuReport(device)) peakFlops_ = knownPeakFlops(report->name);
  }
  if (val_) {
    TokenSamplerOptions o;
    o.batchSize = config.train.batchSize;
    o.blockSize = blockSize_;
    o.rank = group.rank();
    o.world = group.size();
    // The split's consecutive windows, each once (llm.c's val loader); a split too short for one
    // step's worth gives random windows that overlap (nanoGPT's estimate_loss draws those whatever
    // the length), the same ones at every evaluation: iteration k draws (seed, rank, k).
    int64_t windows = 0;
    for (const auto& shard : val_->shards()) windows += std::max<int64_t>(shard.size() - 1, 0) / blockSize_;
    const bool overlapping = windows < o.batchSize * o.world;
    o.sampling = overlapping ? TokenSampling::kRandom : TokenSampling::kSequential;
    o.seed = config.seed;
    valWindows_ = data::asBadTokenInput([&] { return std::make_unique<TokenSampler>(val_, o); },
                                        " (data.val_files: the validation loss takes train.batch_size windows per rank)");
    const int64_t distinct = valWindows_->stepsPerEpoch();
    if (overlapping && group.rank() == 0) {
      spdlog::warn("data.val_files holds {} window(s) of model.block_size + 1 tokens, fewer than the {} one "
                   "evaluation batch takes (train.batch_size x {} rank(s)): the validation loss is measured on "
                   "overlapping random windows (as nanoGPT's), the same ones at every evaluation",
                   windows, o.batchSize * o.world, o.world);
    } else if (config.eval.iters > distinct && group.rank() == 0) {
      spdlog::warn("eval.iters is {} but data.val_files holds {} distinct batches of train.batch_size windows per "
                   "rank: the validation loss takes the first ones again (they weigh more); eval.iters={} covers the "
                   "validation split once", config.eval.iters, distinct, distinct);
    }
  }
}

std::optional<double> LanguageModelRecords::mfu(double samplesPerS) const {
  if (peakFlops_ <= 0 || samplesPerS <= 0) return std::nullopt;
  // nanoGPT's estimate_mfu per device: each rank's share of the tokens against one device's peak.
  return model_->estimateMfu(tokensPerSecond(samplesPerS) / group_.size(), 1.0, peakFlops_);
}

void LanguageModelRecords::addRates(nlohmann::json& record, double samplesPerS) const {
  record["tokens_per_s"] = tokensPerSecond(samplesPerS);
  if (const auto m = mfu(samplesPerS)) record["mfu"] = *m;
}

std::string LanguageModelRecords::progressNote(double samplesPerS) const {
  const auto m = mfu(samplesPerS);
  return fmt::format(" | {:.0f} tokens/s{}", tokensPerSecond(samplesPerS),
                     m ? fmt::format(", MFU {:.1f}%", 100 * *m) : std::string());
}

bool LanguageModelRecords::validationDue(int64_t step) const {
  return val_ && config_.eval.interval > 0 && step % config_.eval.interval == 0;
}

double LanguageModelRecords::validationLoss(at::ScalarType autocast) {
  DDP_ENFORCE(val_ != nullptr, "validationLoss without data.val_files");
  const bool wasTraining = model_->is_training();
  model_->eval();
  c10::NoGradGuard noGrad;
  at::Tensor sum = at::zeros({1}, at::TensorOptions().device(group_.collectiveDevice()));
  const int64_t steps = valWindows_->stepsPerEpoch();  // >= 1 (the sampler's constructor checked)
  for (int64_t k = 0; k < config_.eval.iters; ++k) {
    const int64_t rows = (k % steps) * valWindows_->rowsPerStep();
    const TokenBatch b = val_->batch(valWindows_->windowStarts(rows, k), blockSize_);
    const Autocast mixed(device_.type(), autocast, /*enabled=*/autocast != at::kFloat);
    const at::Tensor x = b.x.to(device_);
    const at::Tensor loss = lossOf(forward_ ? forward_(x) : model_->forward(x), b.y.to(device_));
    sum.add_(loss.detach().to(sum.device(), at::kFloat).reshape({1}));
  }
  group_.allReduce(sum, ReduceOp::kAvg);
  if (wasTraining) model_->train();
  return sum.item<double>() / static_cast<double>(config_.eval.iters);
}

}  // namespace ddp::worker
