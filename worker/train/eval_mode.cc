#include "worker/train/eval_mode.h"

#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include <filesystem>

#include "common/host_memory.h"
#include "ddp/checkpoint.h"
#include "ddp/files.h"
#include "worker/data/gather_batch.h"
#include "worker/train/evaluate.h"
#include "worker/train/lm_records.h"
#include "worker/train/optimizer_setup.h"
#include "worker/data/token_corpus.h"
#include "worker/train/metrics.h"
#include "worker/models/model_size.h"
#include "worker/models/models.h"
#include "worker/train/trainer.h"

namespace ddp::worker {

namespace {

// eval.json, not summary.json: output.dir is often the training run's, whose summary it would
// replace. What was evaluated, then `results`.
void writeEvalJson(const WorkerConfig& config, c10::Device device, const nlohmann::json& results) {
  nlohmann::json record = {{"mode", "eval"},
                           {"model_path", std::filesystem::absolute(config.eval.modelPath).string()},
                           {"model", config.model.name},
                           {"data", config.data.name},
                           {"device", device.str()}};
  record.update(results);
  makeDirectories(config.output.dir, "output.dir");
  writeSummary(config.output.dir + "/eval.json", record);
  spdlog::info("kept in {}/eval.json", config.output.dir);
}

// A gpt: nanoGPT's estimate_loss on the validation split (eval_only), eval.iters windows of
// train.batch_size per rank, averaged over the ranks.
int evalLanguageModel(const WorkerConfig& config, ProcessGroup& group, Datasets data) {
  const c10::Device device = group.device();
  data.input.classes = data::checkedVocabulary(*data.tokens, config.model);
  checkInferenceFits(config.model, data.input, memoryLimit());
  auto model = makeModel(config.model, data.input);
  loadModelWeights(*model.ptr(), config.eval.modelPath);  // the file's recorded model.* checked first
  model.ptr()->to(device);
  auto records = LanguageModelRecords::make(config, data, *model.ptr(), group, device);
  const double loss = records->validationLoss(autocastDtype(config.train.precision));
  spdlog::info("evaluated {} on {}: validation loss {:.4f} ({} batches of {} windows: eval.iters, train.batch_size)",
               config.eval.modelPath, device.str(), loss, config.eval.iters, config.train.batchSize);
  writeEvalJson(config, device,
                {{"val_loss", loss},
                 {"eval_iters", config.eval.iters},
                 {"windows_per_rank", config.eval.iters * config.train.batchSize},
                 {"world_size", group.size()}});
  return 0;
}

}  // namespace

int runEvalMode(const WorkerConfig& config, ProcessGroup& group) {
  const c10::Device device = group.device();
  Datasets data = loadDatasets(config.data, config.seed, Splits::kEvalOnly);
  if (data.tokens) return evalLanguageModel(config, group, std::move(data));
  checkInferenceFits(config.model, data.input, memoryLimit());
  auto model = makeModel(config.model, data.input);
  // Loaded on the CPU (every tensor is mapped there), then moved: map_location done right.
  loadModel(*model.ptr(), config.eval.modelPath);
  model.ptr()->to(device);

  const data::SampleSource test = data.testSource();
  const EvalCounts counts = evaluate(model, test, device, config.eval.batchSize, group,
                                     loaderOptions(config.data, device, config.seed, 0));
  spdlog::info("evaluated {} on {}: test accuracy {:.2f}% ({}/{})", config.eval.modelPath, device.str(),
               100 * counts.accuracy(), counts.correct, counts.total);
  const int64_t show = std::min<int64_t>(config.eval.show, test.size());
  if (show > 0) {
    c10::NoGradGuard noGrad;
    const data::Batch first =
        test.loader(data::contiguousBatches(0, show, show), loaderOptions(config.data, device, config.seed, 0))->next();
    const at::Tensor logits = model.forward(first.images.to(device)).cpu();
    const at::Tensor predicted = logits.argmax(1);
    for (int64_t i = 0; i < show; ++i) {
      spdlog::info("sample {}: predicted {} (p={:.3f}), label {}", i, predicted[i].item<int64_t>(),
                   logits[i].softmax(0)[predicted[i]].item<double>(), first.labels[i].item<int64_t>());
    }
  }
  writeEvalJson(config, device,
                {{"test_correct", counts.correct}, {"test_total", counts.total}, {"test_accuracy", counts.accuracy()}});
  return 0;
}

}  // namespace ddp::worker
