#include "libddp/checkpoint/training_checkpoint.h"

#include <zlib.h>

#include <cstdio>

#include "common/error.h"
#include "libddp/checkpoint/torch_file.h"
#include "libddp/checkpoint/torch_file_writer.h"

namespace ddp::checkpoint {
namespace {

class Crc {
 public:
  void add(const void* data, size_t n) {
    const auto* p = static_cast<const Bytef*>(data);
    while (n > 0) {
      const auto chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
      crc_ = crc32(crc_, p, chunk);
      p += chunk;
      n -= chunk;
    }
  }
  void add(const std::string& s) { add(s.data(), s.size() + 1); }  // with the terminator: "ab","c" ≠ "a","bc"
  void add(int64_t v) { add(&v, sizeof v); }
  void add(const at::Tensor& t) {
    add(static_cast<int64_t>(t.scalar_type()));
    add(static_cast<int64_t>(t.dim()));
    for (auto s : t.sizes()) add(s);
    const at::Tensor c = t.cpu().contiguous();
    add(c.data_ptr(), c.nbytes());
  }
  void add(const NamedTensors& tensors) {
    add(static_cast<int64_t>(tensors.size()));
    for (const auto& [name, t] : tensors) {
      add(name);
      add(t);
    }
  }
  uint32_t value() const { return static_cast<uint32_t>(crc_); }

 private:
  uLong crc_ = crc32(0L, Z_NULL, 0);
};

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

PyValuePtr toDict(const NamedTensors& tensors, bool stateDict = false) {
  auto d = stateDict ? pyOrderedDict() : pyDict();  // model: an OrderedDict, as model.state_dict() in Python
  for (const auto& [k, t] : tensors) pySet(*d, k, pyTensor(t));
  return d;
}

int64_t intField(const PyValue& dict, const char* key, const std::string& path) {
  const PyValue* v = dict.get(key);
  if (v == nullptr || v->kind != PyValue::Kind::kInt) {
    DDP_THROW(CheckpointError, "'", path, "' is not a complete training checkpoint (no integer '", key, "')");
  }
  return v->integer;
}

double floatField(const PyValue& dict, const char* key, const std::string& path) {
  const PyValue* v = dict.get(key);
  if (v != nullptr && v->kind == PyValue::Kind::kInt) return static_cast<double>(v->integer);
  if (v == nullptr || v->kind != PyValue::Kind::kFloat) {
    DDP_THROW(CheckpointError, "'", path, "' is not a complete training checkpoint (no number '", key, "')");
  }
  return v->real;
}

}  // namespace

uint32_t checksumOf(const TrainingState& s) {
  Crc crc;
  crc.add(s.model);
  crc.add(s.optimizer);
  for (int64_t v : {s.epoch, s.stepInEpoch, s.globalStep, s.samples, s.worldSize, s.seed}) crc.add(v);
  crc.add(s.cpuRng.defined() ? s.cpuRng : at::Tensor());
  crc.add(static_cast<int64_t>(s.cudaRng.size()));
  for (const auto& t : s.cudaRng) crc.add(t);
  crc.add(s.config);
  if (s.epochSamples) {  // absent in files written before it existed
    crc.add(std::string("epoch_samples"));
    crc.add(*s.epochSamples);
  }
  if (s.microSteps) {  // absent when not recorded
    crc.add(std::string("micro_steps"));
    crc.add(*s.microSteps);
  }
  if (!s.sampleOrder.empty()) {  // absent in files written before it existed
    crc.add(std::string("sample_order"));
    for (const auto& [name, value] : s.sampleOrder) {
      crc.add(name);
      crc.add(value);
    }
  }
  if (!s.cpuRngRanks.empty()) {  // absent in one-rank jobs (and in files written before them)
    crc.add(std::string("cpu_rng_ranks"));
    for (const auto& t : s.cpuRngRanks) crc.add(t);
  }
  if (s.scaler) {  // absent in fp32/bf16 runs (and in files written before it existed)
    crc.add(std::string("scaler"));
    for (double v : {s.scaler->scale, s.scaler->growthFactor, s.scaler->backoffFactor}) crc.add(&v, sizeof v);
    crc.add(s.scaler->growthInterval);
    crc.add(s.scaler->growthTracker);
  }
  return crc.value();
}

void saveTrainingCheckpoint(const TrainingState& s, const std::string& path) {
  // Plain dicts, strings, ints and tensors: what torch.load(path) reads with weights_only=True.
  auto root = pyDict();
  pySet(*root, "format", pyString(kCheckpointFormat));
  pySet(*root, "model", toDict(s.model, /*stateDict=*/true));
  pySet(*root, "optimizer", toDict(s.optimizer));
  auto progress = pyDict();
  pySet(*progress, "epoch", pyInt(s.epoch));
  pySet(*progress, "step_in_epoch", pyInt(s.stepInEpoch));
  pySet(*progress, "global_step", pyInt(s.globalStep));
  pySet(*progress, "samples", pyInt(s.samples));
  pySet(*progress, "world_size", pyInt(s.worldSize));
  pySet(*progress, "seed", pyInt(s.seed));
  if (s.epochSamples) pySet(*progress, "epoch_samples", pyInt(*s.epochSamples));
  if (s.microSteps) pySet(*progress, "micro_steps", pyInt(*s.microSteps));
  if (!s.sampleOrder.empty()) {
    auto order = pyDict();
    for (const auto& [name, value] : s.sampleOrder) pySet(*order, name, pyString(value));
    pySet(*progress, "sample_order", order);
  }
  pySet(*root, "progress", progress);
  NamedTensors rng;
  if (s.cpuRng.defined()) rng.emplace_back("cpu", s.cpuRng);
  for (size_t i = 0; i < s.cpuRngRanks.size(); ++i) rng.emplace_back("cpu" + std::to_string(i + 1), s.cpuRngRanks[i]);
  for (size_t i = 0; i < s.cudaRng.size(); ++i) rng.emplace_back("cuda" + std::to_string(i), s.cudaRng[i]);
  pySet(*root, "rng", toDict(rng));
  pySet(*root, "config", pyString(s.config));
  if (s.scaler) {
    // Python: GradScaler(...).load_state_dict(torch.load(path)["scaler"]).
    auto scaler = pyDict();
    pySet(*scaler, "scale", pyFloat(s.scaler->scale));
    pySet(*scaler, "growth_factor", pyFloat(s.scaler->growthFactor));
    pySet(*scaler, "backoff_factor", pyFloat(s.scaler->backoffFactor));
    pySet(*scaler, "growth_interval", pyInt(s.scaler->growthInterval));
    pySet(*scaler, "_growth_tracker", pyInt(s.scaler->growthTracker));
    pySet(*root, "scaler", scaler);
  }
  pySet(*root, "checksum", pyString("crc32:" + hex(checksumOf(s))));
  writeTorchFile(*root, path);
}

TrainingState loadTrainingCheckpoint(const std::string& path) {
  const PyValuePtr root = readTorchFile(path);
  const PyValue* format = root->get("format");
  if (format == nullptr || format->text != kCheckpointFormat) {
    DDP_THROW(CheckpointError, "'", path, "' is not a ddp-launch training checkpoint (no format '",
              kCheckpointFormat, "'); to start from a model file load it with ddp::loadModel instead of resuming");
  }
  TrainingState s;
  for (const char* section : {"model", "optimizer", "progress", "rng"}) {
    if (root->get(section) == nullptr || root->get(section)->kind != PyValue::Kind::kDict) {
      DDP_THROW(CheckpointError, "'", path, "' is corrupt: section '", section, "' is missing");
    }
  }
  s.model = tensorEntries(*root->get("model"));
  s.optimizer = tensorEntries(*root->get("optimizer"));
  const PyValue& progress = *root->get("progress");
  s.epoch = intField(progress, "epoch", path);
  s.stepInEpoch = intField(progress, "step_in_epoch", path);
  s.globalStep = intField(progress, "global_step", path);
  s.samples = intField(progress, "samples", path);
  s.worldSize = intField(progress, "world_size", path);
  s.seed = intField(progress, "seed", path);
  if (progress.get("epoch_samples") != nullptr) s.epochSamples = intField(progress, "epoch_samples", path);
  if (progress.get("micro_steps") != nullptr) s.microSteps = intField(progress, "micro_steps", path);
  if (const PyValue* order = progress.get("sample_order")) {
    if (order->kind != PyValue::Kind::kDict) {
      DDP_THROW(CheckpointError, "'", path, "' is corrupt: 'sample_order' is not a dict");
    }
    for (const auto& [name, value] : order->entries) {
      if (name->kind != PyValue::Kind::kString || value->kind != PyValue::Kind::kString) {
        DDP_THROW(CheckpointError, "'", path, "' is corrupt: 'sample_order' holds a value that is not a string");
      }
      s.sampleOrder[name->text] = value->text;
    }
  }
  // "cpu" (rank 0's), "cpu1", "cpu2", ... (the other ranks'), "cuda0", "cuda1", ..., in that order.
  for (const auto& [name, t] : tensorEntries(*root->get("rng"))) {
    if (name == "cpu") s.cpuRng = t;
    else if (name.rfind("cpu", 0) == 0) s.cpuRngRanks.push_back(t);
    else s.cudaRng.push_back(t);
  }
  // Every save writes it (the checksum covers it): without it the file is damaged, not a LibTorch error.
  if (!s.cpuRng.defined()) DDP_THROW(CheckpointError, "'", path, "' is corrupt: section 'rng' has no 'cpu' generator");
  if (const PyValue* config = root->get("config")) s.config = config->text;
  if (const PyValue* scaler = root->get("scaler")) {
    ScalerState st;
    st.scale = floatField(*scaler, "scale", path);
    st.growthFactor = floatField(*scaler, "growth_factor", path);
    st.backoffFactor = floatField(*scaler, "backoff_factor", path);
    st.growthInterval = intField(*scaler, "growth_interval", path);
    st.growthTracker = intField(*scaler, "_growth_tracker", path);
    s.scaler = st;
  }
  const PyValue* stored = root->get("checksum");
  const std::string expected = "crc32:" + hex(checksumOf(s));
  if (stored == nullptr || stored->text != expected) {
    DDP_THROW(CheckpointError, "'", path, "' is corrupt: checksum ", stored ? stored->text : "<none>",
              " stored, ", expected, " computed");
  }
  return s;
}

}  // namespace ddp::checkpoint
