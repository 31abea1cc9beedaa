#include "worker/config/config_fields.h"

#include <cstdlib>
#include <cmath>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <string_view>
#include <type_traits>

#include "common/error.h"

namespace ddp::worker {
namespace {

template <typename T>
Field bindField(const std::string& key, const std::string& type, T& ref) {
  return Field{key, type, [&ref](const YAML::Node& n) { ref = n.as<T>(); },
               [&ref] { return YAML::Node(ref); }};
}

// An empty value (`output.dir=`, `dir:` with nothing after it) is the empty string, which means the
// key's default or is refused by validateConfig(); yaml-cpp would read it as the text "null".
template <>
Field bindField<std::string>(const std::string& key, const std::string& type, std::string& ref) {
  return Field{key, type, [&ref](const YAML::Node& n) { ref = n.IsNull() ? std::string() : n.as<std::string>(); },
               [&ref] { return YAML::Node(ref); }};
}

// Shortest faithful form: 0.05, not 0.050000000000000003; [0.485, 0.456], not [0.485000014, 0.456]:
// the fewest digits from `digits10` (15 for a double, 6 for a float) up that read back as the same
// value (at most max_digits10: 17, 9).
template <typename T>
std::string shortestText(T value) {
  std::ostringstream text;
  for (int digits = std::numeric_limits<T>::digits10; digits <= std::numeric_limits<T>::max_digits10; ++digits) {
    text.str("");
    text.precision(digits);
    text << value;
    const std::string s = text.str();
    T back;
    if constexpr (std::is_same_v<T, float>) back = std::strtof(s.c_str(), nullptr);
    else back = std::strtod(s.c_str(), nullptr);
    if (back == value || std::isnan(value)) break;
  }
  return text.str();
}

template <>
Field bindField<double>(const std::string& key, const std::string& type, double& ref) {
  return Field{key, type, [&ref](const YAML::Node& n) { ref = n.as<double>(); },
               [&ref] { return YAML::Node(shortestText(ref)); }};
}

// Lists of numbers (train.betas, data.mean, data.std), each in its shortest faithful form.
template <typename T>
Field bindNumberList(const std::string& key, const std::string& type, std::vector<T>& ref) {
  return Field{key, type, [&ref](const YAML::Node& n) { ref = n.as<std::vector<T>>(); },
               [&ref] {
                 YAML::Node list(YAML::NodeType::Sequence);
                 for (const T v : ref) list.push_back(shortestText(v));
                 return list;
               }};
}

template <>
Field bindField<std::vector<double>>(const std::string& key, const std::string& type, std::vector<double>& ref) {
  return bindNumberList(key, type, ref);
}

template <>
Field bindField<std::vector<float>>(const std::string& key, const std::string& type, std::vector<float>& ref) {
  return bindNumberList(key, type, ref);
}

Field bindMode(const std::string& key, Mode& ref) {
  return Field{key, "one of ddp | dp | single | eval | generate",
               [&ref, key](const YAML::Node& n) {
                 const std::string v = n.IsNull() ? std::string() : n.as<std::string>();  // `mode=`: '', not 'null'
                 if (v == "ddp") ref = Mode::kDdp;
                 else if (v == "dp") ref = Mode::kDp;
                 else if (v == "single") ref = Mode::kSingle;
                 else if (v == "eval") ref = Mode::kEval;
                 else if (v == "generate") ref = Mode::kGenerate;
                 else DDP_THROW(ConfigError, "config: '", key, "' is '", v, "'; use one of ddp | dp | single | eval | generate");
               },
               [&ref] { return YAML::Node(modeName(ref)); }};
}

// A choice among names, held as the library's enum (parsed here, once): a name it does not know is
// "config: '<key>' is '<value>'; use <names>".
template <typename E>
Field bindChoice(const std::string& key, E& ref, std::optional<E> (*parse)(std::string_view), const char* (*name)(E),
                 const std::string& names) {
  return Field{key, "string",
               [&ref, key, parse, names](const YAML::Node& n) {
                 const std::string v = n.IsNull() ? std::string() : n.as<std::string>();
                 const std::optional<E> parsed = parse(v);
                 if (!parsed) DDP_THROW(ConfigError, "config: '", key, "' is '", v, "'; use ", names);
                 ref = *parsed;
               },
               [&ref, name] { return YAML::Node(std::string(name(ref))); }};
}

// The keys of the run: mode, backend, device, seed, resume, threads, numerics, init, in the order `worker --config-keys` lists them.
std::vector<Field> runFields(WorkerConfig& c) {
  return {
      bindMode("mode", c.mode),
      bindChoice("backend", c.backend, ddp::parseBackend, ddp::backendName, "auto, gloo, nccl or shm"),
      bindField("device", "string", c.device),
      bindField("seed", "non-negative integer", c.seed),
      bindField("resume", "string", c.resume),
      bindField("threads", "integer", c.threads),
      bindField("deterministic_algorithms", "boolean", c.deterministicAlgorithms),
      bindField("cudnn.benchmark", "boolean", c.cudnn.benchmark),
      bindField("cudnn.deterministic", "boolean", c.cudnn.deterministic),
      bindField("cuda.sync_debug", "string", c.cuda.syncDebug),
      bindField("init.model_path", "string", c.init.modelPath),
  };
}

// The keys of model.*, in the order `worker --config-keys` lists them.
std::vector<Field> modelFields(WorkerConfig& c) {
  return {
      bindField("model.name", "string", c.model.name),
      bindField("model.hidden", "list of integers", c.model.hidden),
      bindField("model.batch_norm", "boolean", c.model.batchNorm),
      bindField("model.sync_batch_norm", "boolean", c.model.syncBatchNorm),
      bindField("model.path", "string", c.model.path),
      bindField("model.unused_layer", "boolean", c.model.unusedLayer),
      bindField("model.n_layer", "integer", c.model.nLayer),
      bindField("model.n_head", "integer", c.model.nHead),
      bindField("model.n_embd", "integer", c.model.nEmbd),
      bindField("model.block_size", "integer", c.model.blockSize),
      bindField("model.vocab_size", "integer", c.model.vocabSize),
      bindField("model.dropout", "number", c.model.dropout),
      bindField("model.bias", "boolean", c.model.bias),
  };
}

// The keys of data.*, in the order `worker --config-keys` lists them.
std::vector<Field> dataFields(WorkerConfig& c) {
  return {
      bindField("data.name", "string", c.data.name),
      bindField("data.root", "string", c.data.root),
      bindField("data.train_limit", "integer", c.data.trainLimit),
      bindField("data.synthetic_train", "integer", c.data.syntheticTrain),
      bindField("data.synthetic_test", "integer", c.data.syntheticTest),
      bindField("data.synthetic_classes", "integer", c.data.syntheticClasses),
      bindField("data.train_file", "string", c.data.trainFile),
      bindField("data.test_file", "string", c.data.testFile),
      bindField("data.classes", "integer", c.data.classes),
      bindField("data.image_size", "integer", c.data.imageSize),
      bindField("data.mean", "list of numbers", c.data.mean),
      bindField("data.std", "list of numbers", c.data.stddev),
      bindField("data.one_copy_per_host", "boolean", c.data.oneCopyPerHost),
      bindField("data.num_workers", "integer", c.data.numWorkers),
      bindField("data.prefetch_batches", "integer", c.data.prefetchBatches),
      bindField("data.pin_memory", "boolean", c.data.pinMemory),
      bindField("data.rotate_degrees", "number", c.data.rotateDegrees),
      bindField("data.crop_padding", "integer", c.data.cropPadding),
      bindField("data.horizontal_flip", "boolean", c.data.horizontalFlip),
      bindField("data.train_files", "string", c.data.trainFiles),
      bindField("data.val_files", "string", c.data.valFiles),
      bindField("data.sampling", "string", c.data.sampling),
      bindField("data.stream", "string", c.data.stream),
      bindField("data.train_transform", "string", c.data.trainTransform),
      bindField("data.memory_budget_mb", "integer", c.data.memoryBudgetMb),
      bindField("data.skip_bad_images", "boolean", c.data.skipBadImages),
      bindField("data.jpeg_dct_scaling", "boolean", c.data.jpegDctScaling),
      bindField("data.max_image_pixels", "integer", c.data.maxImagePixels),
  };
}

// The keys of train.*, in the order `worker --config-keys` lists them.
std::vector<Field> trainFields(WorkerConfig& c) {
  return {
      bindField("train.epochs", "integer", c.train.epochs),
      bindField("train.batch_size", "integer", c.train.batchSize),
      bindField("train.lr", "number", c.train.lr),
      bindField("train.momentum", "number", c.train.momentum),
      bindField("train.weight_decay", "number", c.train.weightDecay),
      bindField("train.max_steps", "integer", c.train.maxSteps),
      bindField("train.shuffle", "boolean", c.train.shuffle),
      bindField("train.drop_last", "boolean", c.train.dropLast),
      bindField("train.uneven_inputs", "string", c.train.unevenInputs),
      bindField("train.log_every", "integer", c.train.logEvery),
      bindField("train.accumulate_steps", "integer", c.train.accumulateSteps),
      bindField("train.skip_nonfinite_steps", "boolean", c.train.skipNonfiniteSteps),
      bindField("train.optimizer", "string", c.train.optimizer),
      bindField("train.betas", "list of two numbers", c.train.betas),
      bindField("train.eps", "number", c.train.eps),
      bindField("train.nesterov", "boolean", c.train.nesterov),
      bindField("train.fused", "string", c.train.fused),
      bindField("train.zero", "boolean", c.train.zero),
      bindChoice("train.sharding", c.train.sharding, parseSharding, shardingName, "none, zero1, zero2 or full"),
      bindChoice("train.lr_schedule", c.train.lrSchedule, ddp::parseLrDecay, ddp::lrDecayName,
                 "constant, step, cosine or linear"),
      bindField("train.warmup_steps", "integer", c.train.warmupSteps),
      bindField("train.min_lr", "number", c.train.minLr),
      bindField("train.decay_steps", "integer", c.train.decaySteps),
      bindField("train.step_size", "integer", c.train.stepSize),
      bindField("train.gamma", "number", c.train.gamma),
      bindField("train.clip_grad_norm", "number", c.train.clipGradNorm),
      bindField("train.precision", "string", c.train.precision),
      bindField("train.channels_last", "boolean", c.train.channelsLast),
      bindField("train.cuda_graph", "boolean", c.train.cudaGraph),
      bindField("train.activation_checkpointing", "boolean", c.train.activationCheckpointing),
      bindField("train.loss_scale_init", "number", c.train.lossScale.initScale),
      bindField("train.loss_scale_growth_interval", "integer", c.train.lossScale.growthInterval),
  };
}

// The keys of eval.*, generate.*, checkpoint.*, output.*, in the order `worker --config-keys` lists them.
std::vector<Field> outputFields(WorkerConfig& c) {
  return {
      bindField("eval.enabled", "boolean", c.eval.enabled),
      bindField("eval.batch_size", "integer", c.eval.batchSize),
      bindField("eval.model_path", "string", c.eval.modelPath),
      bindField("eval.show", "integer", c.eval.show),
      bindField("eval.interval", "integer", c.eval.interval),
      bindField("eval.iters", "integer", c.eval.iters),
      bindField("generate.model_path", "string", c.generate.modelPath),
      bindField("generate.start", "string", c.generate.start),
      bindField("generate.num_samples", "integer", c.generate.numSamples),
      bindField("generate.max_new_tokens", "integer", c.generate.maxNewTokens),
      bindField("generate.temperature", "number", c.generate.temperature),
      bindField("generate.top_k", "integer", c.generate.topK),
      bindField("checkpoint.dir", "string", c.checkpoint.dir),
      bindField("checkpoint.every_steps", "integer", c.checkpoint.everySteps),
      bindField("checkpoint.every_epochs", "integer", c.checkpoint.everyEpochs),
      bindField("checkpoint.keep_last", "integer", c.checkpoint.keepLast),
      bindField("output.dir", "string", c.output.dir),
      bindField("output.export", "string", c.output.exportName),
      bindField("output.dump_rank_params", "boolean", c.output.dumpRankParams),
      bindField("output.sample_log", "boolean", c.output.sampleLog),
      bindField("output.tensorboard", "boolean", c.output.tensorboard),
      bindField("output.profile_start", "integer", c.output.profileStart),
      bindField("output.profile_steps", "integer", c.output.profileSteps),
      bindField("output.peak_flops", "number", c.output.peakFlops),
  };
}

// The keys of comm.*, dp.*, in the order `worker --config-keys` lists them.
std::vector<Field> commFields(WorkerConfig& c) {
  return {
      bindField("comm.timeout_s", "number", c.comm.timeoutS),
      bindChoice("comm.reducer", c.comm.ddp.reducer, ddp::parseReducer, ddp::reducerName, "bucketed or flat"),
      bindField("comm.bucket_cap_mb", "number", c.comm.ddp.bucketCapMb),
      bindField("comm.first_bucket_mb", "number", c.comm.ddp.firstBucketCapMb),
      bindField("comm.find_unused_parameters", "boolean", c.comm.ddp.findUnusedParameters),
      bindField("comm.broadcast_buffers", "boolean", c.comm.ddp.broadcastBuffers),
      bindField("comm.gradient_as_bucket_view", "boolean", c.comm.ddp.gradientAsBucketView),
      bindChoice("comm.compression", c.comm.ddp.compression, ddp::parseCompression, ddp::compressionName,
                 "none, fp16 or bf16"),
      bindField("comm.hook", "string", c.comm.hook),
      bindField("comm.powersgd_rank", "integer", c.comm.powersgd.matrixApproximationRank),
      bindField("comm.powersgd_start_iter", "integer", c.comm.powersgd.startPowerSgdIter),
      bindField("comm.static_graph", "boolean", c.comm.ddp.staticGraph),
      bindField("comm.check_collectives", "boolean", c.comm.checkCollectives),
      bindField("comm.ddp_on_one_rank", "boolean", c.comm.ddp.syncOnOneRank),
      bindField("dp.device_ids", "list of integers", c.dp.deviceIds),
      bindField("dp.output_device", "integer", c.dp.outputDevice),
      bindField("dp.replicas", "integer", c.dp.replicas),
  };
}

}  // namespace

std::vector<Field> fieldsOf(WorkerConfig& c) {
  std::vector<Field> fields;
  for (auto* section : {runFields, modelFields, dataFields, trainFields, outputFields, commFields}) {
    auto more = section(c);
    fields.insert(fields.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  }
  return fields;
}

}  // namespace ddp::worker
