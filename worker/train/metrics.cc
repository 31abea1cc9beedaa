#include "worker/train/metrics.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "common/no_follow.h"
#include "worker/config/config.h"
#include "worker/train/trainer.h"
#include "ddp/files.h"

namespace ddp::worker {

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  if (const std::string why = claimFile(path, append); !why.empty()) {
    DDP_THROW(ConfigError, "output.dir: cannot write '", path, "': ", why);
  }
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!out_) DDP_THROW(ConfigError, "output.dir: cannot write '", path, "'; set output.dir to a writable directory");
  id_ = fileIdOf(path);
}

bool MetricsWriter::removed() const { return out_.is_open() && fileIdOf(path_) != id_; }

void MetricsWriter::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  out_ << record.dump() << '\n';
  out_.flush();
}

nlohmann::json trainingSummary(const WorkerConfig& config, const TrainResult& result, int worldSize,
                               const std::string& mode, const std::string& backend,
                               const std::string& device, int64_t globalBatch) {
  nlohmann::json summary = {
      {"world_size", worldSize},
      {"mode", mode},
      {"backend", backend},
      {"device", device},
      {"model", config.model.name},
      {"data", config.data.name},
      {"batch_size_per_rank", config.train.batchSize},
      {"global_batch_size", globalBatch},
      {"steps", result.steps},
      {"skipped_steps", result.skippedSteps},
      {"precision", config.train.precision},
      {"samples", result.samples},
      {"uneven_inputs", config.train.unevenInputs},
      {"train_seconds", result.trainSeconds},
      {"samples_per_s", result.samplesPerSecond},
      {"final_loss", result.finalLoss},
      {"eval_seconds", result.evalSeconds},
      {"export_path", std::filesystem::absolute(result.exportPath).string()},
      {"comm_hook", config.comm.hook},
      {"gradient_elements", result.gradientElements},
      {"gradient_elements_sent", result.gradientElementsSent},
  };
  if (result.testTotal > 0) {  // a test set was evaluated (not with eval.enabled false, nor for a GPT)
    summary["test_correct"] = result.testCorrect;
    summary["test_total"] = result.testTotal;
    summary["test_accuracy"] = result.testAccuracy;
  }
  if (config.model.name == "gpt") {
    summary["tokens_per_s"] = result.tokensPerSecond;
    summary["block_size"] = config.model.blockSize;
    if (result.valLoss >= 0) {
      summary["val_loss"] = result.valLoss;
      summary["val_loss_step"] = result.valLossStep;  // an earlier step's where eval.enabled is false
    }
    if (result.mfu >= 0) summary["mfu"] = result.mfu;
  }
  if (result.streamedImages) {
    summary["data_streamed"] = true;
    summary["skipped_images"] = result.skippedImages;
  }
  if (!result.stragglerCounts.empty()) {
    summary["stragglers"] = {{"logged_steps_last_per_rank", result.stragglerCounts},
                             {"max_late_s", result.stragglerMaxSkewS},
                             {"max_late_rank", result.stragglerMaxSkewRank}};
  }
  return summary;
}

void logDone(const TrainResult& result) {
  // eval.enabled false: no test set was evaluated, so no accuracy to report.
  const std::string accuracy =
      result.testTotal > 0 ? fmt::format(", test accuracy {:.2f}% ({}/{})", 100 * result.testAccuracy,
                                         result.testCorrect, result.testTotal)
                           : std::string();
  const std::string tokens = result.tokensPerSecond > 0 ? fmt::format(" ({:.0f} tokens/s)", result.tokensPerSecond)
                                                       : std::string();
  // The last validation loss; with eval.enabled false none is taken at the end, so it may be an earlier step's.
  const std::string val = result.valLoss < 0 ? std::string()
                          : result.valLossStep == result.steps
                              ? fmt::format(", validation loss {:.4f}", result.valLoss)
                              : fmt::format(", validation loss {:.4f} at step {} (eval.enabled false: none after the last step)",
                                            result.valLoss, result.valLossStep);
  const std::string loss =
      result.tookNoStep ? "no step taken by this run" : fmt::format("final loss {:.4f}", result.finalLoss);
  spdlog::info("done: {} steps, {:.0f} samples/s{}, {}{}{}, exported {}", result.steps, result.samplesPerSecond, tokens,
               loss, val, accuracy, result.exportPath);
}

int64_t summarySteps(const std::string& path) {
  std::ifstream in(path);
  const nlohmann::json summary = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  const auto steps = summary.is_object() ? summary.find("steps") : summary.end();
  return steps != summary.end() && steps->is_number_integer() ? steps->get<int64_t>() : -1;
}

void writeSummary(const std::string& path, const nlohmann::json& summary) {
  // Text a model generated at byte level need not be UTF-8 (a sample can end inside a character):
  // such bytes are written as U+FFFD, as Python's bytes.decode(errors="replace"), not an exception.
  writeFileAtomic(path, summary.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

}  // namespace ddp::worker
