// What a language model's run adds to its records: tokens/s and MFU (nanoGPT's estimate_mfu) on the
// logged steps, and the validation loss (nanoGPT's estimate_loss, on fixed windows) every
// eval.interval steps and at the end. The loop holds one when model.name is gpt.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ddp/process_group.h"
#include "ddp/token_data.h"
#include "worker/config/config.h"
#include "worker/data/datasets.h"
#include "worker/models/gpt.h"

namespace ddp::worker {

/// The bf16 dense peak FLOP/s of the GPUs nanoGPT and llm.c are run on, by the name CUDA reports
/// (A100 312e12, H100 SXM 989e12, H200 989e12, ...); 0 for any other.
double knownPeakFlops(const std::string& gpuName);

class LanguageModelRecords {
 public:
  /// Null unless `module` is a gpt (data.name tokens).
  /// `forward`: the model's forward for the validation loss (train.sharding full: through its root
  /// unit, a collective); null: the module's own.
  static std::unique_ptr<LanguageModelRecords> make(const WorkerConfig& config, const Datasets& data,
                                                    torch::nn::Module& module, ProcessGroup& group, c10::Device device,
                                                    std::function<at::Tensor(const at::Tensor&)> forward = nullptr);

  /// tokens_per_s (and mfu when a peak is known) for a logged step at `samplesPerS` windows/s, all ranks.
  void addRates(nlohmann::json& record, double samplesPerS) const;
  /// " | 51234 tokens/s, MFU 31.2%" for the progress line.
  std::string progressNote(double samplesPerS) const;
  double tokensPerSecond(double samplesPerS) const { return samplesPerS * static_cast<double>(blockSize_); }
  /// The MFU at `samplesPerS`, or nullopt without a peak (a CPU, an unknown GPU, no output.peak_flops).
  std::optional<double> mfu(double samplesPerS) const;

  /// Whether there are validation windows (data.val_files).
  bool hasValidation() const { return val_ != nullptr; }
  /// Whether the validation loss is due after `step` (every eval.interval steps).
  bool validationDue(int64_t step) const;
  /// The mean loss of the model over eval.iters batches of train.batch_size windows per rank, the
  /// same windows every time (the validation set's first rows, rank-strided as llm.c, wrapping
  /// around a short set); every rank gets the same value (an average over the group). Collective.
  /// The model is in eval mode meanwhile (no dropout), in `autocast`'s precision.
  double validationLoss(at::ScalarType autocast);

 private:
  LanguageModelRecords(const WorkerConfig& config, const Datasets& data, Gpt model, ProcessGroup& group,
                       c10::Device device, std::function<at::Tensor(const at::Tensor&)> forward);

  const WorkerConfig& config_;
  Gpt model_;
  std::function<at::Tensor(const at::Tensor&)> forward_;  // null: model_->forward
  ProcessGroup& group_;
  c10::Device device_;
  int64_t blockSize_;
  double peakFlops_ = 0;  // FLOP/s per rank (one device each)
  std::shared_ptr<const TokenData> val_;
  std::unique_ptr<TokenSampler> valWindows_;
};

}  // namespace ddp::worker
