// The worker's configuration: plain structs with their defaults. Only
// config.cc knows YAML; the rest of the worker sees these structs.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <string>
#include <utility>
#include <vector>

#include "ddp/grad_scaler.h"
#include "ddp/collectives.h"
#include "ddp/comm_hook.h"
#include "ddp/ddp_options.h"
#include "ddp/lr_schedule.h"

namespace ddp::worker {

enum class Mode { kDdp, kDp, kSingle, kEval, kGenerate };

/// train.sharding: what each rank of mode ddp keeps of the model's training state. kNone: DDP (a
/// whole copy of parameters, gradients and optimizer state); kZero1: the optimizer state sharded
/// (ddp::ZeroRedundancyOptimizer, train.zero's alias); kZero2: gradients and optimizer state
/// sharded, parameters whole (ddp::fullyShard with replicateParameters, DeepSpeed's stage 2);
/// kFull: parameters, gradients and optimizer state sharded (ddp::fullyShard, FSDP2).
enum class Sharding { kNone, kZero1, kZero2, kFull };
const char* shardingName(Sharding sharding);
std::optional<Sharding> parseSharding(std::string_view name);

struct ModelConfig {
  std::string name = "cnn";               // mlp | cnn (Fashion-MNIST CNN: conv32-pool-conv64-pool-fc128-fc10)
  std::vector<int64_t> hidden = {512, 256};  // mlp hidden layer widths
  bool batchNorm = false;                    // cnn: BatchNorm2d after each conv (has buffers)
  bool syncBatchNorm = false;  // with batchNorm, mode ddp: ddp::SyncBatchNorm (statistics of the whole batch)
  bool unusedLayer = false;  // adds Linear 'unused' that forward never calls (find_unused_parameters tests)
  std::string path;          // torchscript: the file torch.jit.script(model).save(path) wrote
  // gpt: nanoGPT's GPT (model.py), its GPTConfig's names and defaults (GPT-2 small's shape).
  int64_t nLayer = 12;
  int64_t nHead = 12;
  int64_t nEmbd = 768;
  int64_t blockSize = 1024;  // the context: tokens per window
  int64_t vocabSize = 0;     // 0 = the data set's (meta.json beside the shards), else 50304 as nanoGPT
  double dropout = 0.0;
  bool bias = true;          // biases in the Linears and LayerNorms (GPT-2: true)
};

struct DataConfig {
  std::string name = "fashion-mnist";                    // fashion-mnist | synthetic | tensors
  std::string root = "/usr/share/datasets/fashion-mnist";  // Debian's dataset-fashion-mnist
  int64_t trainLimit = 0;      // use only the first N training samples (0 = all)
  int64_t syntheticTrain = 8192;  // synthetic: training samples
  int64_t syntheticTest = 1024;   // synthetic: test samples
  int64_t syntheticClasses = 10;
  std::string trainFile;  // tensors: torch.save({"x": ..., "y": ...}) of the training split
  std::string testFile;   // tensors: ... of the test split
  int64_t classes = 0;    // tensors: number of classes; 0 = the largest label + 1
  int64_t imageSize = 0;  // image_folder: resize every image to this square size (0 = keep; all equal)
  std::vector<float> mean;    // image_folder: per-channel Normalize mean after x / 255 (empty = 0)
  std::vector<float> stddev;  // image_folder: ... and std (empty = 1)
  // One rank per host loads the data into shared memory, the others map it read-only
  // (false: every rank loads its own copy).
  bool oneCopyPerHost = true;
  // Loading (PyTorch DataLoader's num_workers, prefetch_factor, pin_memory).
  int64_t numWorkers = -1;      // threads assembling batches ahead; -1 = auto: 0 on CPU, 2 on a GPU
  int64_t prefetchBatches = 2;  // per loader thread
  bool pinMemory = true;        // GPU: page-locked batches, copied on a side stream (ignored on CPU)
  // Training-set augmentation, per sample, reproducible from (seed, epoch, sample).
  double rotateDegrees = 0;     // RandomRotation(d), bilinear
  int64_t cropPadding = 0;      // RandomCrop(size, padding=p)
  bool horizontalFlip = false;  // RandomHorizontalFlip()
  // tokens: token shards (llm.c's format, or nanoGPT's raw uint16 .bin), memory-mapped.
  std::string trainFiles;  // a glob, e.g. data/fortunes/train_*.bin
  std::string valFiles;    // a glob for evaluation's windows ("" = no validation loss)
  std::string sampling = "random";  // random (nanoGPT's get_batch) | sequential (llm.c's DataLoader)
  // image_folder, streamed (read and decoded per batch, never the whole set in memory).
  std::string stream = "auto";          // auto (tar shards, imagenet, or over the budget) | true | false
  std::string trainTransform = "none";  // none (resize to image_size) | imagenet (torchvision's recipe)
  int64_t memoryBudgetMb = 0;           // auto's budget for decoded images (0 = a quarter of the host's memory)
  bool skipBadImages = false;           // a corrupt image is logged and left out instead of ending the job
  bool jpegDctScaling = true;           // decode large JPEGs at 1/2, 1/4, 1/8 scale when the crop allows
  int64_t maxImagePixels = 2 * 89478485;  // larger headers refused (Pillow's decompression-bomb limit); 0 = none
};

struct TrainConfig {
  int64_t epochs = 1;
  int64_t batchSize = 64;  // per rank, like DDP; the global batch is batch_size × world size
  double lr = 0.05;
  double momentum = 0.9;
  double weightDecay = 0.0;
  int64_t maxSteps = 0;    // stop after this many optimizer steps (0 = no limit)
  bool shuffle = true;     // DistributedSampler shuffle, reseeded with seed + epoch
  bool dropLast = false;   // DistributedSampler drop_last
  // pad: the sampler repeats the head so every rank has as many batches (PyTorch's
  // DistributedSampler); join: no sample twice, a rank without a batch for a step takes part with
  // zero gradients (DistributedDataParallel::backwardWithoutBatch, PyTorch's Join).
  std::string unevenInputs = "pad";
  int64_t logEvery = 20;   // steps between metrics.jsonl records
  int64_t accumulateSteps = 1;  // micro-batches per optimizer step; no communication until the last (no_sync)
  bool skipNonfiniteSteps = false;  // a NaN/Inf gradient skips that step (up to 10 in a row) instead of failing
  // The optimizer: LibTorch's SGD, AdamW (decoupled weight decay) or Adam, with PyTorch's defaults.
  std::string optimizer = "sgd";             // sgd | adamw | adam
  std::vector<double> betas = {0.9, 0.999};  // adam, adamw
  double eps = 1e-8;                         // adam, adamw
  bool nesterov = false;                     // sgd (needs momentum > 0)
  bool zero = false;           // ZeRO stage 1 (ddp::ZeroRedundancyOptimizer): each rank keeps its shard's optimizer state
  // none | zero1 (= train.zero: true) | full (ddp::fullyShard: parameters, gradients and optimizer
  // state sharded); the two keys agree after parsing.
  Sharding sharding = Sharding::kNone;
  std::string fused = "auto";  // adam, adamw: LibTorch's fused kernel (ddp::FusedAdamW): auto (on CUDA) | true | false
  // The learning rate per optimizer step (ddp::LrSchedule): warm-up, then the schedule.
  ddp::LrDecay lrSchedule = ddp::LrDecay::kConstant;  // constant | step | cosine | linear
  int64_t warmupSteps = 0;              // linear warm-up: step k < W uses lr·(k+1)/(W+1)
  double minLr = 0;                     // cosine, linear: the lr the decay ends at
  int64_t decaySteps = 0;               // cosine, linear: the step the decay ends at (0 = the run's last)
  int64_t stepSize = 0;                 // step: every step_size steps (after the warm-up) ...
  double gamma = 0.1;                   // ... the lr is multiplied by gamma (StepLR)
  double clipGradNorm = 0;              // > 0: clip_grad_norm_ of the averaged gradients to this
  // Mixed precision: the forward (and loss) under autocast on the rank's device, master weights and
  // optimizer state in fp32; fp16 with a dynamic loss scale (ddp::GradScaler), bf16 without.
  std::string precision = "fp32";  // fp32 | bf16 | fp16
  bool channelsLast = false;       // 4-D weights and input batches in channels_last (NHWC) memory
  bool cudaGraph = false;          // GPU: capture the whole step once (forward, backward, all-reduces, optimizer) and replay it
  // ddp::activationCheckpoint around each unit (GPT: each block; MLP, CNN: each layer but the
  // last; ResNet: each stage): its activations recomputed in backward instead of kept.
  bool activationCheckpointing = false;
  ddp::GradScalerOptions lossScale;  // fp16: train.loss_scale_init (initScale), loss_scale_growth_interval
};

struct EvalConfig {
  bool enabled = true;      // test accuracy over the whole test set at the end
  // 100: LibTorch's CPU convolutions slow down on larger batches (measured: Fashion-MNIST CNN,
  // 10 000 test images, 2 cores: 1.49 s at 100, 2.83 s at 1000 on 2.15; 2.02 s vs 4.24 s on 1.13).
  int64_t batchSize = 100;
  std::string modelPath;    // mode eval: the model file to evaluate (our export, a state_dict, a checkpoint)
  int64_t show = 5;         // mode eval: print predictions for this many test samples
  // Language models: the validation loss (nanoGPT's estimate_loss) every `interval` steps (0 = at the
  // end only) over `iters` batches of train.batch_size windows per rank.
  int64_t interval = 0;
  int64_t iters = 20;
};

// mode: generate — text from a trained gpt, as nanoGPT's sample.py (its names and defaults).
struct GenerateConfig {
  std::string modelPath;        // "" = output.dir/output.export (the model this config trained)
  std::string start = "\n";     // the prompt; "FILE:path" reads it from a file, as sample.py
  int64_t numSamples = 10;
  int64_t maxNewTokens = 500;
  double temperature = 0.8;     // < 1: less random, > 1: more
  int64_t topK = 200;           // keep the k likeliest tokens (0 = all)
};

struct OutputConfig {
  std::string dir = "out";             // metrics.jsonl, summary.json, the export
  std::string exportName = "model.pt"; // state_dict with plain keys, loads in Python's torch.load
  bool dumpRankParams = false;         // every rank writes rank<R>_params.pt (for tests)
  bool sampleLog = false;              // every rank appends the indices of each batch it trains on to
                                       // dir/samples_rank<R>.txt (an audit of what each epoch saw)
  bool tensorboard = false;            // rank 0 writes TensorBoard event files to dir/tensorboard
  int64_t profileStart = 0;            // > 0: every rank profiles steps profileStart.. (ddp::Profiler)
  int64_t profileSteps = 5;            // into dir/profile_rank<R>.json (Chrome trace)
  double peakFlops = 0;                // language models: the device's peak FLOP/s for MFU (0 = known GPUs' bf16 peak; none on CPU)
};

/// The library's DDP options as the worker's comm.* keys set them: comm.reducer (bucketed | flat),
/// bucket_cap_mb, first_bucket_mb, find_unused_parameters, broadcast_buffers, gradient_as_bucket_view,
/// compression (none | fp16 | bf16), static_graph, ddp_on_one_rank (DdpOptions::syncOnOneRank). The
/// library's defaults, but gradient_as_bucket_view: on (grads alias the buckets: no copy back, no
/// second copy in memory). Its commHook comes from comm.hook.
inline ddp::DdpOptions workerDdpDefaults() {
  ddp::DdpOptions o;
  o.gradientAsBucketView = true;
  return o;
}

struct CommConfig {
  double timeoutS = 300;                 // rendezvous and every collective
  ddp::DdpOptions ddp = workerDdpDefaults();  // what the DDP engine is built with
  std::string hook = "none";             // none | fp16 | bf16 | powersgd (DDP communication hooks)
  ddp::PowerSgdOptions powersgd;         // comm.powersgd_rank (matrixApproximationRank), powersgd_start_iter
  bool checkCollectives = false;         // compare every collective with rank 0's before it runs
};

struct CheckpointConfig {
  std::string dir;          // training checkpoints; empty = <output.dir>/checkpoints
  int64_t everySteps = 0;   // save every N optimizer steps (0 = off)
  int64_t everyEpochs = 0;  // save at the end of every N epochs (0 = off)
  int64_t keepLast = 3;     // keep the newest N (0 = keep all)
};

struct DpConfig {
  std::vector<int64_t> deviceIds;  // CUDA: logical GPU ids (after CUDA_VISIBLE_DEVICES); empty = all visible
  int64_t outputDevice = -1;       // CUDA: where outputs are gathered; -1 = device_ids[0]
  int64_t replicas = 2;            // CPU: replicas, one thread each
};

struct InitConfig {
  // Initial weights from a model file (our export, a Python state_dict with or without "module.",
  // a checkpoint dict); not a resume: optimizer and position start fresh. "" = seeded init.
  std::string modelPath;
};

// torch.backends.cudnn.benchmark / .deterministic and torch.use_deterministic_algorithms.
struct CudnnConfig {
  bool benchmark = false;      // let cuDNN time its algorithms per input shape and keep the fastest
  bool deterministic = false;  // only deterministic cuDNN algorithms
};

// GPU checks.
struct CudaConfig {
  // torch.cuda.set_sync_debug_mode between log steps: off | warn | error (a call that makes the
  // host wait for the GPU warns, or fails the run naming it).
  std::string syncDebug = "off";
};

struct WorkerConfig {
  Mode mode = Mode::kDdp;
  ddp::Backend backend = ddp::Backend::kAuto;  // auto | gloo | nccl | shm
  std::string device = "auto";   // auto (cuda:LOCAL_RANK if a GPU is present) | cpu | cuda | cuda:N
  uint64_t seed = 0;
  std::string resume;            // "" = start fresh; auto = latest valid checkpoint in checkpoint.dir; or a path
  int64_t threads = 0;           // intra-op threads per process (0 = OMP_NUM_THREADS or LibTorch's default)
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  EvalConfig eval;
  GenerateConfig generate;
  OutputConfig output;
  CommConfig comm;
  DpConfig dp;
  CheckpointConfig checkpoint;
  InitConfig init;
  CudnnConfig cudnn;
  CudaConfig cuda;
  bool deterministicAlgorithms = false;  // every op deterministic, or an error naming the one that is not
};

/// checkpoint.dir, or <output.dir>/checkpoints when it is empty.
std::string checkpointDir(const WorkerConfig& config);

std::string modeName(Mode mode);

/// Reads a YAML file and applies `dotted.key=value` overrides. Unknown keys,
/// wrong types and out-of-range values throw ConfigError naming the key.
WorkerConfig loadConfig(const std::string& path, const std::vector<std::string>& overrides = {});

/// The same from YAML text (tests, and the resolved-config round trip).
WorkerConfig parseConfig(const std::string& yamlText, const std::vector<std::string>& overrides = {});

/// The resolved configuration as YAML, every key present.
std::string dumpConfig(const WorkerConfig& config);

/// Every key with its resolved value as YAML text (lists in flow style), in configKeys() order.
std::vector<std::pair<std::string, std::string>> configValues(const WorkerConfig& config);

/// Every key the config accepts, dotted.
std::vector<std::string> configKeys();

}  // namespace ddp::worker
