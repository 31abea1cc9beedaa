// The rules a resolved config must meet, section by section: each one line naming the key, its
// value and the fix (ConfigError), checked before anything runs.
#include "worker/config/config_rules.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>

#include "common/dir_lock.h"
#include "common/error.h"

namespace ddp::worker {
namespace {

// More intra-op threads than this per core only adds scheduling overhead.
constexpr int64_t kThreadsPerCore = 4;
// Bucket sizes become byte counts: 1 TB is beyond any model, far below size_t's range.
constexpr double kMaxBucketMb = 1e6;
// Timeouts become std::chrono::milliseconds; far beyond any real wait, far below overflow.
constexpr double kMaxTimeoutS = 7 * 24 * 3600;
constexpr int64_t kMaxEpochs = 1000000000;
constexpr int64_t kMaxBatch = 2147483647;

void require(bool ok, const std::string& key, const std::string& rule) {
  if (!ok) DDP_THROW(ConfigError, "config: '", key, "' ", rule);
}

// The optimizer, the learning-rate schedule and clipping (train.*).
void validateRecipe(const TrainConfig& t) {
  require(t.optimizer == "sgd" || t.optimizer == "adamw" || t.optimizer == "adam", "train.optimizer",
          "is '" + t.optimizer + "'; use sgd, adamw or adam");
  require(t.betas.size() == 2 && t.betas[0] >= 0 && t.betas[0] < 1 && t.betas[1] >= 0 && t.betas[1] < 1,
          "train.betas", "must be two numbers in [0, 1), e.g. [0.9, 0.999]");
  require(t.eps > 0 && std::isfinite(t.eps), "train.eps", "must be a positive finite number, e.g. 1e-8");
  require(!t.nesterov || t.optimizer == "sgd", "train.nesterov", "applies to train.optimizer: sgd only");
  require(!t.nesterov || t.momentum > 0, "train.nesterov", "needs train.momentum > 0 (PyTorch's rule)");
  require(t.fused == "auto" || t.fused == "true" || t.fused == "false", "train.fused",
          "is '" + t.fused + "'; use auto (fused on GPUs), true or false");
  require(t.warmupSteps >= 0, "train.warmup_steps", "must be >= 0 (0 = no warm-up)");
  require(t.minLr >= 0 && t.minLr < t.lr, "train.min_lr", "must be >= 0 and below train.lr");
  require(t.decaySteps >= 0, "train.decay_steps", "must be >= 0 (0 = the run's last step)");
  require(t.lrSchedule != ddp::LrDecay::kStep || t.stepSize >= 1, "train.step_size",
          "must be >= 1 with train.lr_schedule: step (steps between two multiplications by train.gamma)");
  require(t.gamma > 0 && t.gamma <= 1, "train.gamma", "must be in (0, 1]");
  require(t.clipGradNorm >= 0 && std::isfinite(t.clipGradNorm), "train.clip_grad_norm",
          "must be a finite number >= 0 (0 = no clipping)");
  require(t.precision == "fp32" || t.precision == "bf16" || t.precision == "fp16", "train.precision",
          "is '" + t.precision + "'; use fp32, bf16 or fp16");
  // The scale is a float32 on the device: outside its normal range it becomes inf or 0.
  require(t.lossScale.initScale >= std::numeric_limits<float>::min() &&
              t.lossScale.initScale <= std::numeric_limits<float>::max(),
          "train.loss_scale_init",
          "must be a positive number a float32 holds, 1.2e-38 to 3.4e38 (GradScaler's init_scale, default 65536)");
  require(t.lossScale.growthInterval >= 1, "train.loss_scale_growth_interval",
          "must be >= 1 (GradScaler's growth_interval, default 2000)");
}

// model.*, and the modes sync_batch_norm applies to.
void validateModel(const WorkerConfig& c) {
  require(c.model.name != "torchscript" || !c.model.path.empty(), "model.path",
          "is needed with model.name torchscript: a file saved by torch.jit.script(model).save(path)");
  require(c.model.name == "mlp" || c.model.name == "cnn" || c.model.name == "torchscript" || c.model.name == "gpt" ||
              c.model.name == "resnet18" || c.model.name == "resnet34" || c.model.name == "resnet50",
          "model.name", "is '" + c.model.name + "'; use mlp, cnn, resnet18, resnet34, resnet50, torchscript or gpt");
  require(!c.model.hidden.empty(), "model.hidden", "must list at least one layer width");
  const bool resnet = c.model.name == "resnet18" || c.model.name == "resnet34" || c.model.name == "resnet50";
  require(!c.model.syncBatchNorm || (c.model.name == "cnn" && c.model.batchNorm) || resnet, "model.sync_batch_norm",
          "synchronises BatchNorm layers; use a ResNet (model.name: resnet18, ...) or model.name: cnn with "
          "model.batch_norm: true");
  require(!c.model.syncBatchNorm || c.mode == Mode::kDdp || c.mode == Mode::kEval, "model.sync_batch_norm",
          "is for mode ddp (as PyTorch's SyncBatchNorm is for DistributedDataParallel only): in single, BatchNorm sees "
          "the whole batch; in dp, each replica normalises its part of the batch, as nn.DataParallel's do");
  for (auto h : c.model.hidden) require(h > 0, "model.hidden", "widths must be positive");
}

// data.name image_folder read as a stream (data.stream, data.train_transform, ...).
void validateImageStream(const WorkerConfig& c) {
  const DataConfig& d = c.data;
  require(d.stream == "auto" || d.stream == "true" || d.stream == "false", "data.stream",
          "is '" + d.stream + "'; use auto (stream when the decoded images would not fit data.memory_budget_mb), true "
          "or false");
  require(d.trainTransform == "none" || d.trainTransform == "imagenet", "data.train_transform",
          "is '" + d.trainTransform + "'; use none (resize to data.image_size) or imagenet (RandomResizedCrop + flip, "
          "evaluation Resize + CenterCrop)");
  require(d.memoryBudgetMb >= 0, "data.memory_budget_mb", "must be >= 0 (0 = a quarter of this host's memory)");
  require(d.maxImagePixels >= 0, "data.max_image_pixels", "must be >= 0 (0 = no limit)");
  const bool images = d.name == "image_folder";
  require(images || d.stream == "auto", "data.stream", "streams data.name image_folder; this job reads " + d.name);
  require(images || d.trainTransform == "none", "data.train_transform",
          "is for data.name image_folder; this job reads " + d.name);
  require(images || !d.skipBadImages, "data.skip_bad_images", "is for data.name image_folder; this job reads " + d.name);
  if (!images) return;
  require(d.stream != "false" || d.trainTransform == "none", "data.train_transform",
          "is imagenet, which crops every image anew each epoch from the file: it needs data.stream: auto or true");
  require(d.stream != "false" || d.trainFiles.empty(), "data.stream",
          "is false but data.train_files names tar shards, which are always streamed; set data.stream: auto");
  require(d.stream != "false" || !d.skipBadImages, "data.skip_bad_images",
          "skips bad images met while streaming; with data.stream: false every image is decoded at start-up, where "
          "a bad one is named and ends the job");
  // auto streams to skip them, and a stream resizes every image to data.image_size.
  require(d.stream != "auto" || !d.skipBadImages || d.imageSize > 0 || !d.trainFiles.empty(), "data.skip_bad_images",
          "leaves bad images out as a stream meets them, and a stream resizes each image to data.image_size, which "
          "is 0; set data.image_size (e.g. 224), or data.skip_bad_images: false");
  require(d.stream == "false" || d.trainTransform == "none" || d.imageSize > 0, "data.image_size",
          "is needed with data.train_transform: imagenet: the side of the crops, e.g. 224");
  require(d.stream != "true" || d.imageSize > 0, "data.image_size",
          "is needed with data.stream: true: the side of the square each image is resized to, e.g. 224");
  require(d.trainFiles.empty() || d.imageSize > 0, "data.image_size",
          "is needed with tar shards (data.train_files): the side of the square each image is resized to, e.g. 224");
}

// Which data set and how its images and labels are read (data.*).
void validateDataSource(const WorkerConfig& c) {
  require(c.data.name == "fashion-mnist" || c.data.name == "synthetic" || c.data.name == "tensors" ||
              c.data.name == "image_folder" || c.data.name == "tokens",
          "data.name", "is '" + c.data.name + "'; use fashion-mnist, synthetic, tensors, image_folder or tokens");
  require(c.data.imageSize >= 0 && c.data.imageSize <= 4096, "data.image_size", "must be from 0 (keep) to 4096");
  require(c.data.mean.empty() || c.data.mean.size() == 3, "data.mean", "needs 3 values (R, G, B), e.g. [0.485, 0.456, 0.406]");
  require(c.data.stddev.empty() || c.data.stddev.size() == 3, "data.std", "needs 3 values (R, G, B), e.g. [0.229, 0.224, 0.225]");
  for (float s : c.data.stddev) require(s > 0, "data.std", "values must be > 0");
  require(c.data.name != "tensors" || (!c.data.trainFile.empty() && !c.data.testFile.empty()), "data.train_file",
          "and data.test_file are needed with data.name tensors: files written by torch.save({\"x\": x, \"y\": y}, path)");
  require(c.data.classes >= 0, "data.classes", "must be >= 0 (0 = the largest label + 1)");
  require(c.data.trainLimit >= 0, "data.train_limit", "must be >= 0 (0 = all)");
  validateImageStream(c);
}

// model.name gpt on data.name tokens (and only there): nanoGPT's shape rules, the windows' sampling.
void validateLanguageModel(const WorkerConfig& c) {
  const bool gpt = c.model.name == "gpt";
  const bool tokens = c.data.name == "tokens";
  require(!gpt || tokens, "model.name",
          "is gpt, a language model, but data.name is " + c.data.name + "; use data.name: tokens with data.train_files "
          "(token shards: scripts/prepare_text.py)");
  require(gpt || c.mode != Mode::kGenerate, "mode",
          "is generate, which writes text with a language model; use model.name: gpt (and its data.name: tokens)");
  require(gpt || !tokens, "data.name",
          "is tokens (a language corpus) but model.name is " + c.model.name + ", which classifies images; use model.name: gpt");
  // The ranges, whatever the model (a wrong value is a mistake even where it is not read).
  require(c.data.sampling == "random" || c.data.sampling == "sequential", "data.sampling",
          "is '" + c.data.sampling + "'; use random (nanoGPT's random windows) or sequential (llm.c's order)");
  require(c.model.nLayer >= 1, "model.n_layer", "must be >= 1");
  require(c.model.nHead >= 1, "model.n_head", "must be >= 1");
  if (c.model.nEmbd < 1 || c.model.nEmbd % c.model.nHead != 0) {
    DDP_THROW(ConfigError, "config: 'model.n_embd' (", c.model.nEmbd, ") must be a positive multiple of model.n_head (",
              c.model.nHead, "): each head takes n_embd / n_head channels");
  }
  require(c.model.blockSize >= 1, "model.block_size", "must be >= 1 (tokens per window)");
  require(c.model.vocabSize >= 0, "model.vocab_size", "must be >= 0 (0 = the data set's, from its meta.json)");
  require(c.model.dropout >= 0 && c.model.dropout < 1, "model.dropout", "must be in [0, 1)");
  require(c.eval.interval >= 0, "eval.interval", "must be >= 0 (0 = the validation loss at the end only)");
  require(c.eval.iters >= 1, "eval.iters", "must be >= 1 (batches per rank for the validation loss)");
  require(c.output.peakFlops >= 0, "output.peak_flops", "must be >= 0 (0 = the GPU's known peak; none on a CPU)");
  require(c.generate.numSamples >= 1, "generate.num_samples", "must be >= 1");
  require(c.generate.maxNewTokens >= 1, "generate.max_new_tokens", "must be >= 1");
  // Below it the logits divided by it overflow float32 and the softmax is NaN.
  require(c.generate.temperature >= 1e-6 && std::isfinite(c.generate.temperature), "generate.temperature",
          "must be a positive number, at least 1e-06 (nanoGPT's sample.py: 0.8)");
  require(c.generate.topK >= 0, "generate.top_k", "must be >= 0 (0 = every token)");
  if (!gpt) return;
  require(!c.data.trainFiles.empty(), "data.train_files",
          "is needed with data.name tokens: a glob of token shards, e.g. data/fortunes/train_*.bin (scripts/prepare_text.py)");
  require(c.data.trainFile.empty() && c.data.testFile.empty(), c.data.trainFile.empty() ? "data.test_file" : "data.train_file",
          "names a tensors file (data.name tensors), which data.name tokens does not read; give the token shards as "
          "data.train_files and data.val_files (globs)");
  require(c.mode != Mode::kDp, "mode",
          "is dp, for image classifiers; use mode ddp (or single) with model.name gpt, or mode generate");
  require(c.mode != Mode::kEval || !c.data.valFiles.empty(), "data.val_files",
          "is empty, but mode eval of a gpt measures the validation loss on it; give the validation shards' glob");
  require(c.train.unevenInputs == "pad", "train.uneven_inputs",
          "is join, but every rank has a full batch of windows at every step with data.name tokens; leave it pad");
  require(!c.output.sampleLog, "output.sample_log", "lists image sample indices; data.name tokens has none, set it false");
  require(c.data.trainLimit == 0, "data.train_limit",
          "limits the samples of an image or tensors data set; data.name tokens draws windows from its shards: "
          "use train.max_steps (or fewer shards in data.train_files)");
}

// output.profile_*: which steps the profiler traces.
void validateProfiling(const WorkerConfig& c) {
  require(c.output.profileStart >= 0, "output.profile_start", "must be >= 0 (0 = no profile; N = from step N)");
  require(c.output.profileSteps >= 1 && c.output.profileSteps <= 10000, "output.profile_steps",
          "must be from 1 to 10000 steps (the trace grows with every op)");
}

// The synthetic set's sizes, the loader threads and the augmentation (data.*).
void validateDataLoading(const WorkerConfig& c) {
  require(c.data.syntheticTrain > 0, "data.synthetic_train", "must be > 0");
  require(c.data.syntheticTest > 0, "data.synthetic_test", "must be > 0");
  require(c.data.syntheticClasses >= 2, "data.synthetic_classes", "must be >= 2");
  require(c.data.numWorkers >= -1 && c.data.numWorkers <= 64, "data.num_workers",
          "must be from 0 to 64 loader threads, or -1 (auto: 0 on CPU, 2 on a GPU)");
  require(c.data.prefetchBatches >= 1 && c.data.prefetchBatches <= 64, "data.prefetch_batches", "must be from 1 to 64");
  require(c.data.rotateDegrees >= 0 && c.data.rotateDegrees <= 180, "data.rotate_degrees", "must be from 0 to 180");
  require(c.data.cropPadding >= 0 && c.data.cropPadding <= 64, "data.crop_padding", "must be from 0 to 64");
  require(c.data.name != "synthetic" || (c.data.rotateDegrees == 0 && c.data.cropPadding == 0 && !c.data.horizontalFlip),
          "data.rotate_degrees", "(and crop_padding, horizontal_flip) augment images; data.name synthetic has none");
}

// device, eval.show, and what modes eval and dp need.
void validateDeviceAndMode(const WorkerConfig& c) {
  const bool cudaIndexed = c.device.rfind("cuda:", 0) == 0 && c.device.size() > 5 &&
                           c.device.find_first_not_of("0123456789", 5) == std::string::npos;
  require(c.device == "auto" || c.device == "cpu" || c.device == "cuda" || cudaIndexed, "device",
          "is '" + c.device + "'; use auto, cpu, cuda or cuda:N");
  require(c.eval.show >= 0, "eval.show", "must be >= 0");
  require(c.mode != Mode::kEval || !c.eval.modelPath.empty(), "eval.model_path",
          "must name the model file to evaluate when mode is eval");
  // Autocast is per thread and DataParallel's replicas run on threads of their own.
  require(c.mode != Mode::kDp || c.train.precision == "fp32", "train.precision",
          "is " + c.train.precision + " but mode dp (DataParallel) trains in fp32 only; use mode ddp for mixed precision");
}

void validateCheckpoint(const WorkerConfig& c) {
  require(c.checkpoint.everySteps >= 0, "checkpoint.every_steps", "must be >= 0 (0 = off)");
  require(c.checkpoint.everyEpochs >= 0, "checkpoint.every_epochs", "must be >= 0 (0 = off)");
  require(c.checkpoint.keepLast >= 0, "checkpoint.keep_last", "must be >= 0 (0 = keep all)");
}

// threads: 0 or at most kThreadsPerCore per core of this machine.
void validateThreads(const WorkerConfig& c) {
  require(c.threads >= 0, "threads", "must be >= 0 (0 = default)");
  const int64_t maxThreads = kThreadsPerCore * std::max<int64_t>(1, std::thread::hardware_concurrency());
  require(c.threads <= maxThreads, "threads",
          "is " + std::to_string(c.threads) + " but this machine has " +
              std::to_string(std::max<unsigned>(1, std::thread::hardware_concurrency())) +
              " cores; use at most " + std::to_string(maxThreads) + " (0 = default)");
}

// The loop's numbers: train.epochs to train.log_every, and eval.batch_size.
void validateTrainingLoop(const WorkerConfig& c) {
  // Step and sample counts are products of these: bounded far below int64's overflow.
  require(c.train.epochs >= 1 && c.train.epochs <= kMaxEpochs, "train.epochs", "must be from 1 to 1000000000");
  require(c.train.batchSize >= 1 && c.train.batchSize <= kMaxBatch, "train.batch_size",
          "must be from 1 to 2147483647");
  require(c.train.lr > 0, "train.lr", "must be > 0");
  require(std::isfinite(c.train.lr), "train.lr", "must be a finite number, e.g. 0.05");
  require(c.train.momentum >= 0 && c.train.momentum < 1, "train.momentum", "must be in [0, 1)");
  require(c.train.weightDecay >= 0, "train.weight_decay", "must be >= 0");
  require(std::isfinite(c.train.weightDecay), "train.weight_decay", "must be a finite number, e.g. 1e-4");
  require(c.train.maxSteps >= 0, "train.max_steps", "must be >= 0 (0 = no limit)");
  require(c.train.logEvery >= 1, "train.log_every", "must be >= 1");
  require(c.eval.batchSize >= 1 && c.eval.batchSize <= kMaxBatch, "eval.batch_size", "must be from 1 to 2147483647");
}

// What the job itself writes in output.dir (besides the export), for output.export to stay clear of;
// "" when `name` is none of it.
std::string ownOutputFile(const std::string& name) {
  static const std::pair<const char*, const char*> kFiles[] = {
      {"summary.json", "the run's summary"},         {"metrics.jsonl", "the metrics log"},
      {"config.resolved.yaml", "the resolved config"}, {"tensorboard", "the TensorBoard directory"},
      {"checkpoints", "the checkpoint directory"},   {"hang_report.json", "the launcher's hang report"},
      {kJobLockFile, "the directory's lock"},  {"eval.json", "mode eval's results"},
      {"generated.json", "mode generate's samples"}, {".", "the directory itself"},
      {"..", "the directory above"}};
  for (const auto& [file, what] : kFiles) {
    if (name == file) return what;
  }
  const auto numbered = [&name](const std::string& prefix, const std::string& suffix) {
    return name.size() > prefix.size() + suffix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (numbered("samples_rank", ".txt")) return "a rank's sample log";
  if (numbered("profile_rank", ".json")) return "a rank's profiler trace";
  return "";
}

void validateOutput(const WorkerConfig& c) {
  require(!c.output.dir.empty(), "output.dir", "must not be empty");
  require(!c.output.exportName.empty() && c.output.exportName.find('/') == std::string::npos,
          "output.export", "must be a file name inside output.dir");
  const std::string own = ownOutputFile(c.output.exportName);
  require(own.empty(), "output.export",
          "is '" + c.output.exportName + "', the name of " + own + " the job writes in output.dir; name the model "
          "otherwise (e.g. model.pt)");
}

void validateCuda(const WorkerConfig& c) {
  require(c.cuda.syncDebug == "off" || c.cuda.syncDebug == "warn" || c.cuda.syncDebug == "error", "cuda.sync_debug",
          "is '" + c.cuda.syncDebug + "'; use off, warn or error");
}

// Modes dp and single: training in one process, with no gradients reduced over ranks. (The
// training keys of mode ddp are not refused in modes eval and generate, which ignore them: a
// training config evaluates as it is.)
bool inOneTrainingProcess(const WorkerConfig& c) { return c.mode == Mode::kDp || c.mode == Mode::kSingle; }

// comm.*: timeouts, bucket sizes and the communication hook.
void validateComm(const WorkerConfig& c) {
  require(c.comm.timeoutS >= 0.001, "comm.timeout_s", "must be at least 0.001 (1 ms), e.g. 300");
  require(c.comm.timeoutS <= kMaxTimeoutS, "comm.timeout_s",
          "must be at most " + std::to_string(static_cast<int64_t>(kMaxTimeoutS)) + " (7 days)");
  // Megabytes become byte counts (size_t): finite and far below any memory.
  require(c.comm.ddp.bucketCapMb > 0 && c.comm.ddp.bucketCapMb <= kMaxBucketMb, "comm.bucket_cap_mb",
          "must be > 0 and at most " + std::to_string(static_cast<int64_t>(kMaxBucketMb)) + " (MB), e.g. 25");
  require(c.comm.ddp.firstBucketCapMb > 0 && c.comm.ddp.firstBucketCapMb <= kMaxBucketMb, "comm.first_bucket_mb",
          "must be > 0 and at most " + std::to_string(static_cast<int64_t>(kMaxBucketMb)) + " (MB), e.g. 1");
  require(c.comm.hook == "none" || c.comm.hook == "fp16" || c.comm.hook == "bf16" || c.comm.hook == "powersgd",
          "comm.hook", "is '" + c.comm.hook + "'; use none, fp16, bf16 or powersgd");
  require(c.comm.hook == "none" || c.comm.ddp.compression == ddp::GradientCompression::kNone, "comm.hook",
          "is " + c.comm.hook + " and comm.compression is " + ddp::compressionName(c.comm.ddp.compression) +
              ": compression is a hook itself; set one of them");
  require(c.comm.hook == "none" || !inOneTrainingProcess(c), "comm.hook",
          "is for mode ddp: dp and single train in one process and reduce no gradients over ranks");
  require(c.comm.hook == "none" || c.comm.ddp.reducer == ddp::GradientReducer::kBucketed, "comm.hook",
          "reduces the buckets of the bucketed reducer; set comm.reducer: bucketed");
  require(c.comm.powersgd.matrixApproximationRank >= 1 && c.comm.powersgd.matrixApproximationRank <= 1024, "comm.powersgd_rank", "must be from 1 to 1024 (1-4 typical)");
  require(c.comm.powersgd.startPowerSgdIter >= 2, "comm.powersgd_start_iter",
          "must be >= 2: PowerSGD's error feedback and warm start begin after plain all-reduce iterations");
}

// More CPU replicas than this only adds threads (each replica is one).
constexpr int64_t kMaxDpReplicas = 64;

// dp.*: DataParallel's devices and replicas, and what mode dp does not run.
void validateDp(const WorkerConfig& c) {
  for (auto id : c.dp.deviceIds) require(id >= 0, "dp.device_ids", "ids must be >= 0");
  require(c.dp.outputDevice >= -1, "dp.output_device", "must be a device id or -1 (= device_ids[0])");
  require(c.dp.replicas >= 1 && c.dp.replicas <= kMaxDpReplicas, "dp.replicas",
          "must be from 1 to " + std::to_string(kMaxDpReplicas) + " (CPU replicas, one thread each)");
  if (c.mode != Mode::kDp) return;
  if (c.device.rfind("cuda:", 0) == 0) {
    require(false, "device",
            "is " + c.device + ", one GPU, but mode dp spreads its replicas over dp.device_ids (logical ids, default "
            "every visible GPU) and gathers on dp.output_device; use device: cuda (or auto) with dp.device_ids: [" +
            c.device.substr(5) + ", ...]");
  }
  require(c.comm.ddp.compression == ddp::GradientCompression::kNone, "comm.compression",
          std::string("is ") + ddp::compressionName(c.comm.ddp.compression) +
              ", for mode ddp: dp sums its replicas' gradients in one process and sends none; set comm.compression: none");
  require(!c.model.unusedLayer, "model.unused_layer",
          "(a layer forward never reaches, for DDP's find_unused_parameters) is for mode ddp and single; dp's "
          "replicas are copies of the built model without it; set it false");
}

// train.zero: ZeroRedundancyOptimizer's mode and optimizer.
void validateZero(const WorkerConfig& c) {
  require(!c.train.zero || !inOneTrainingProcess(c), "train.zero",
          "shards the optimizer state over the ranks of mode ddp; dp and single train in one process");
  require(!c.train.zero || c.train.fused != "true", "train.zero",
          "steps each shard with LibTorch's SGD, Adam or AdamW; set train.fused: auto or false");
}

// train.sharding full and zero2 (both ddp::fullyShard): what they do not run with (yet).
void validateFullSharding(const WorkerConfig& c) {
  if (c.train.sharding != Sharding::kFull && c.train.sharding != Sharding::kZero2) return;
  const std::string key = "train.sharding";
  const std::string is = std::string("is ") + shardingName(c.train.sharding);
  require(c.mode != Mode::kDp, key,
          is + ", which shards over the processes of mode ddp (or one of mode single); mode dp keeps whole "
          "replicas on threads; use mode ddp");
  require(!c.train.cudaGraph, key, is + ", whose all-gathers and frees per unit a CUDA graph does not capture; "
          "set train.cuda_graph: false");
  require(c.comm.hook == "none" && c.comm.ddp.compression == ddp::GradientCompression::kNone, key,
          is + ", which reduce-scatters its gradients without DDP's communication hooks; set comm.hook: none "
          "and comm.compression: none");
  require(!c.model.syncBatchNorm, key,
          is + ", which does not run with model.sync_batch_norm yet; set model.sync_batch_norm: false or "
          "train.sharding: none");
  require(c.model.name != "torchscript", key,
          is + ", but a TorchScript model's forward cannot run its layers as sharded units; use "
          "train.sharding: none or zero1");
  require(c.train.unevenInputs == "pad", key,
          is + ", whose forwards are collectives every rank joins; set train.uneven_inputs: pad");
}

// train.cuda_graph: what a captured step cannot hold (it reads nothing on the host, and its
// shapes and collectives never change).
void validateCudaGraph(const WorkerConfig& c) {
  const bool graph = c.train.cudaGraph;
  require(!graph || c.mode != Mode::kDp, "train.cuda_graph",
          "is for mode ddp and single; mode dp drives its replicas from host threads each step");
  require(!graph || !c.comm.ddp.findUnusedParameters, "train.cuda_graph",
          "cannot capture comm.find_unused_parameters: its used-parameter map is read on the host every step");
  require(!graph || c.train.precision != "fp16", "train.cuda_graph",
          "does not capture fp16's loss scaler; use train.precision bf16 (no scaler) or fp32");
  require(!graph || c.train.accumulateSteps == 1, "train.cuda_graph",
          "captures one forward and backward per step; set train.accumulate_steps: 1");
  require(!graph || c.train.unevenInputs == "pad", "train.cuda_graph",
          "cannot capture train.uneven_inputs join (the ranks agree on who still trains every step); use pad");
  require(!graph || c.comm.hook == "none", "train.cuda_graph",
          "cannot capture comm.hook (hooks finish on host futures); comm.compression fp16/bf16 can be captured");
  require(!graph || !c.train.zero, "train.cuda_graph", "cannot capture train.zero's per-step shard broadcasts");
  require(!graph || !c.comm.checkCollectives, "train.cuda_graph",
          "cannot capture comm.check_collectives (it asks the store before every collective)");
  require(!graph || c.train.optimizer == "sgd" || c.train.fused != "false", "train.cuda_graph",
          "steps Adam and AdamW with the fused kernel only; set train.fused: auto or true");
}

// train.activation_checkpointing: a recompute of each unit in backward, where it can run.
void validateActivationCheckpointing(const WorkerConfig& c) {
  if (!c.train.activationCheckpointing) return;
  const std::string key = "train.activation_checkpointing";
  require(c.mode != Mode::kDp, key, "is for mode ddp and single; mode dp's replicas are copies without it");
  require(c.model.name != "torchscript", key,
          "recomputes the units of the built-in models (gpt's blocks, mlp's and cnn's layers, resnet's stages); a "
          "TorchScript model's forward has none; set it to false");
  require(!c.model.syncBatchNorm, key,
          "would all-reduce SyncBatchNorm's statistics again in backward; set model.sync_batch_norm: false");
  require(!c.train.cudaGraph, key, "does not run inside a captured CUDA graph yet; set train.cuda_graph: false");
}

// train.uneven_inputs: pad, or join (mode ddp only, and what join cannot run with).
void validateUnevenInputs(const WorkerConfig& c) {
  require(c.train.unevenInputs == "pad" || c.train.unevenInputs == "join", "train.uneven_inputs",
          "is '" + c.train.unevenInputs + "'; use pad (every rank the same number of batches, the sampler "
          "repeats samples) or join (every sample once, ranks without a batch join the step with zeros)");
  if (c.train.unevenInputs == "join") {
    require(!inOneTrainingProcess(c), "train.uneven_inputs",
            "join is for mode ddp (a process per rank, each with its own shard); dp and single train in one "
            "process on all of the data; use pad");
    require(!c.train.dropLast, "train.uneven_inputs",
            "join has nothing to join with train.drop_last: true (every rank gets the same number of samples); "
            "set one of them");
    require(!c.model.syncBatchNorm, "train.uneven_inputs",
            "join cannot run with model.sync_batch_norm: a rank without a batch has no forward to join "
            "SyncBatchNorm's collectives with; use train.uneven_inputs: pad");
  }
}

}  // namespace

// Section by section in a fixed order: of two mistakes, the same one is reported first.
void validateConfig(const WorkerConfig& c) {
  validateModel(c);
  validateDataSource(c);
  validateLanguageModel(c);
  validateProfiling(c);
  validateDataLoading(c);
  validateDeviceAndMode(c);
  validateCheckpoint(c);
  validateThreads(c);
  validateTrainingLoop(c);
  validateOutput(c);
  validateCuda(c);
  validateComm(c);
  require(c.train.accumulateSteps >= 1, "train.accumulate_steps", "must be >= 1");
  validateDp(c);
  validateRecipe(c.train);
  validateZero(c);
  validateFullSharding(c);
  validateCudaGraph(c);
  validateActivationCheckpointing(c);
  require(!c.train.channelsLast || c.mode != Mode::kDp, "train.channels_last",
          "is for mode ddp and single (one replica per process); mode dp copies its replicas contiguous");
  validateUnevenInputs(c);
}

}  // namespace ddp::worker
