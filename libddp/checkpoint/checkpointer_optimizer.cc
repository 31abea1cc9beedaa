// What ddp::Checkpointer saves of an optimizer and puts back: SGD's momentum buffers and Adam's
// (AdamW's, FusedAdamW's) moments by parameter name, ZeRO's shards gathered from every rank, and any
// other optimizer as its own torch::serialize archive.
#include "libddp/checkpoint/checkpointer_optimizer.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/module.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "common/error.h"
#include "ddp/fused_optim.h"
#include "ddp/process_group.h"
#include "ddp/zero_redundancy_optimizer.h"
#include "libddp/checkpoint/optimizer_state.h"

namespace ddp::checkpoint {
namespace {

checkpoint::NamedTensors namedParameters(const torch::nn::Module& module) {
  checkpoint::NamedTensors out;
  for (const auto& item : module.named_parameters(true)) out.emplace_back(item.key(), item.value());
  return out;
}

// ddp::FusedAdamW's state under Adam's keys ("exp_avg.<name>", ..., "step.<name>" as int64): a
// checkpoint of AdamW resumes into FusedAdamW and back.
checkpoint::NamedTensors fusedAdamState(const FusedAdamW& optimizer, const torch::nn::Module& module) {
  checkpoint::NamedTensors out;
  for (const auto& [name, param] : namedParameters(module)) {
    const FusedAdamWState* st = optimizer.stateOf(param);
    if (st == nullptr) continue;
    out.emplace_back("exp_avg." + name, st->expAvg.detach().cpu().clone());
    out.emplace_back("exp_avg_sq." + name, st->expAvgSq.detach().cpu().clone());
    if (st->maxExpAvgSq.defined()) out.emplace_back("max_exp_avg_sq." + name, st->maxExpAvgSq.detach().cpu().clone());
    out.emplace_back("step." + name, at::scalar_tensor(static_cast<int64_t>(st->step.item<float>()), at::kLong));
  }
  return out;
}

void restoreFusedAdamState(FusedAdamW& optimizer, const torch::nn::Module& module, const checkpoint::NamedTensors& saved,
                           const std::string& path) {
  std::map<std::string, std::map<std::string, at::Tensor>> perParam;  // name → prefix → tensor
  const auto params = namedParameters(module);
  std::map<std::string, at::Tensor> byName(params.begin(), params.end());
  for (const auto& [key, value] : saved) {
    bool known = false;
    for (const char* prefix : {"exp_avg.", "exp_avg_sq.", "max_exp_avg_sq.", "step."}) {
      if (key.rfind(prefix, 0) != 0) continue;
      const std::string name = key.substr(std::string(prefix).size());
      if (byName.count(name) == 0) {
        DDP_THROW(CheckpointError, "'", path, "' has optimizer state for unknown parameter '", name, "'");
      }
      perParam[name][prefix] = value;
      known = true;
      break;
    }
    if (!known) {
      DDP_THROW(CheckpointError, path, " holds state of another optimizer than Adam/AdamW ('", key,
                "'); resume with the optimizer that wrote it");
    }
  }
  for (auto& [name, entries] : perParam) {
    const at::Tensor& param = byName.at(name);
    for (const char* required : {"exp_avg.", "exp_avg_sq.", "step."}) {
      if (entries.count(required) == 0) {
        DDP_THROW(CheckpointError, "'", path, "' has incomplete Adam state for '", name, "' (no ", required, name, ")");
      }
    }
    for (const char* moment : {"exp_avg.", "exp_avg_sq.", "max_exp_avg_sq."}) {
      if (entries.count(moment) && !entries[moment].sizes().equals(param.sizes())) {
        DDP_THROW(CheckpointError, "'", path, "' has Adam state of the wrong shape for '", name, "'");
      }
    }
    FusedAdamWState st;
    st.expAvg = entries["exp_avg."].to(param.device(), param.scalar_type()).clone();
    st.expAvgSq = entries["exp_avg_sq."].to(param.device(), param.scalar_type()).clone();
    if (entries.count("max_exp_avg_sq.")) {
      st.maxExpAvgSq = entries["max_exp_avg_sq."].to(param.device(), param.scalar_type()).clone();
    }
    st.step = entries["step."].to(param.device(), at::kFloat).reshape({}).clone();
    optimizer.setStateOf(param, std::move(st));
  }
}

// State by name ("exp_avg.<name>", "momentum_buffer.<name>") for a parameter of the model that this
// optimizer does not hold (built over another subset: a frozen backbone, a head alone) would sit in
// its state unused while it trains a parameter with fresh state: torch's load_state_dict refuses a
// parameter group of another size, so this refuses too, naming the parameter.
void checkStateIsForTheOptimizersParameters(const torch::optim::Optimizer& optimizer, const torch::nn::Module& module,
                                            const checkpoint::NamedTensors& saved, const std::string& path) {
  std::set<const void*> held;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) held.insert(p.unsafeGetTensorImpl());
  }
  const auto params = namedParameters(module);
  const std::map<std::string, at::Tensor> byName(params.begin(), params.end());
  for (const auto& [key, value] : saved) {
    const size_t dot = key.find('.');
    if (key == kArchiveKey || dot == std::string::npos) continue;
    const auto it = byName.find(key.substr(dot + 1));
    if (it == byName.end() || held.count(it->second.unsafeGetTensorImpl()) != 0) continue;
    DDP_THROW(CheckpointError, "'", path, "' has optimizer state for '", it->first, "', a parameter this optimizer "
              "does not hold (it holds ", held.size(), " of the model's ", params.size(), " parameters): build the "
              "optimizer over the parameters of the run that wrote it (torch's load_state_dict refuses a parameter "
              "group of another size)");
  }
}

// The entries of `saved` for the parameters this rank owns, and those parameters by name.
void restoreShardedState(ZeroRedundancyOptimizer& zero, const torch::nn::Module& module,
                         const checkpoint::NamedTensors& saved, const std::string& path, c10::Device device);

}  // namespace

checkpoint::NamedTensors optimizerState(torch::optim::Optimizer& optimizer, const torch::nn::Module& module) {
  if (const auto* fused = dynamic_cast<const FusedAdamW*>(&optimizer)) return fusedAdamState(*fused, module);
  if (auto* sgd = dynamic_cast<torch::optim::SGD*>(&optimizer)) {
    return checkpoint::sgdMomentumBuffers(*sgd, namedParameters(module));  // readable by name in Python
  }
  if (checkpoint::isAdam(optimizer)) return checkpoint::adamMoments(optimizer, namedParameters(module));
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  const std::string data = bytes.str();
  at::Tensor blob = at::empty({static_cast<int64_t>(data.size())}, at::kByte);
  std::memcpy(blob.data_ptr(), data.data(), data.size());
  return {{kArchiveKey, blob}};
}

// ZeroRedundancyOptimizer: every rank's shard of the state by name (its local optimizer's entries,
// the unsharded optimizer's names), broadcast by each rank in turn: names, then dtype and shape per
// entry, then the tensors. Collective; every rank ends with the whole state (rank 0 writes it).
checkpoint::NamedTensors gatherShardedState(ProcessGroup& group, ZeroRedundancyOptimizer& zero,
                                            const torch::nn::Module& module) {
  torch::optim::Optimizer& local = zero.localOptimizer();
  if (dynamic_cast<torch::optim::SGD*>(&local) == nullptr && !checkpoint::isAdam(local)) {
    DDP_THROW(ConfigError, "ddp::Checkpointer: a ZeroRedundancyOptimizer's checkpoint needs SGD, Adam or AdamW as its "
              "optimizer class (their state is saved by name)");
  }
  const checkpoint::NamedTensors mine = optimizerState(local, module);
  checkpoint::NamedTensors all;
  const auto on = at::TensorOptions().device(group.collectiveDevice());
  for (int r = 0; r < group.size(); ++r) {
    const bool sender = group.rank() == r;
    std::string names;
    std::vector<int64_t> meta;
    if (sender) {
      for (const auto& [key, t] : mine) {
        names += key + '\n';
        meta.push_back(static_cast<int64_t>(t.scalar_type()));
        meta.push_back(t.dim());
        for (int64_t d : t.sizes()) meta.push_back(d);
      }
    }
    at::Tensor sizes = at::tensor({static_cast<int64_t>(names.size()), static_cast<int64_t>(meta.size())}, at::kLong).to(group.collectiveDevice());
    group.broadcast(sizes, r);
    sizes = sizes.cpu();
    at::Tensor nameBytes = at::zeros({sizes[0].item<int64_t>()}, at::kByte);
    at::Tensor metaValues = at::zeros({sizes[1].item<int64_t>()}, at::kLong);
    if (sender) {
      std::memcpy(nameBytes.data_ptr(), names.data(), names.size());
      std::memcpy(metaValues.data_ptr(), meta.data(), meta.size() * sizeof(int64_t));
    }
    nameBytes = nameBytes.to(group.collectiveDevice());
    metaValues = metaValues.to(group.collectiveDevice());
    group.broadcast(nameBytes, r);
    group.broadcast(metaValues, r);
    nameBytes = nameBytes.cpu();
    metaValues = metaValues.cpu();
    const std::string text(static_cast<const char*>(nameBytes.data_ptr()), static_cast<size_t>(nameBytes.numel()));
    const int64_t* m = metaValues.data_ptr<int64_t>();
    size_t at = 0, pos = 0;
    for (size_t entry = 0; pos < text.size(); ++entry) {
      const size_t end = text.find('\n', pos);
      const std::string key = text.substr(pos, end - pos);
      pos = end + 1;
      const auto dtype = static_cast<at::ScalarType>(m[at++]);
      const int64_t dims = m[at++];
      std::vector<int64_t> shape(m + at, m + at + dims);
      at += static_cast<size_t>(dims);
      at::Tensor t = sender ? mine[entry].second.contiguous().to(group.collectiveDevice())
                            : at::empty(shape, on.dtype(dtype));
      group.broadcast(t, r);
      all.emplace_back(key, t.cpu());
    }
  }
  return all;
}

void restoreOptimizerState(torch::optim::Optimizer& optimizer, const torch::nn::Module& module,
                           const checkpoint::NamedTensors& saved, const std::string& path, c10::Device device) {
  if (auto* zero = dynamic_cast<ZeroRedundancyOptimizer*>(&optimizer)) {
    restoreShardedState(*zero, module, saved, path, device);
    return;
  }
  checkStateIsForTheOptimizersParameters(optimizer, module, saved, path);
  if (auto* fused = dynamic_cast<FusedAdamW*>(&optimizer)) {
    restoreFusedAdamState(*fused, module, saved, path);
    return;
  }
  if (auto* sgd = dynamic_cast<torch::optim::SGD*>(&optimizer)) {
    for (const auto& [key, value] : saved) {
      if (key == kArchiveKey) {
        DDP_THROW(CheckpointError, path, " holds the state of another optimizer than SGD; resume with the "
                  "optimizer that wrote it");
      }
    }
    if (checkpoint::holdsAdamMoments(saved)) {
      DDP_THROW(CheckpointError, path, " holds Adam/AdamW state, but this optimizer is SGD; resume with the "
                "optimizer that wrote it");
    }
    checkpoint::restoreSgdMomentumBuffers(*sgd, namedParameters(module), saved, path);
    return;
  }
  if (checkpoint::isAdam(optimizer) && !saved.empty() && saved.front().first != kArchiveKey) {
    if (!checkpoint::holdsAdamMoments(saved)) {
      DDP_THROW(CheckpointError, path, " holds SGD momentum buffers, but this optimizer is Adam/AdamW; resume "
                "with the optimizer that wrote it");
    }
    checkpoint::restoreAdamMoments(optimizer, namedParameters(module), saved, path);
    return;
  }
  for (const auto& [key, value] : saved) {
    if (key != kArchiveKey) continue;
    const at::Tensor blob = value.contiguous();
    std::istringstream bytes(std::string(static_cast<const char*>(blob.data_ptr()), static_cast<size_t>(blob.numel())));
    torch::serialize::InputArchive archive;
    archive.load_from(bytes, device);
    try {
      optimizer.load(archive);
    } catch (const c10::Error& e) {
      const std::string what = e.what_without_backtrace();
      DDP_THROW(CheckpointError, path, ": its optimizer state does not fit this optimizer (",
                what.substr(0, what.find('\n')), "); resume with the optimizer and model that wrote it");
    }
    return;
  }
  if (!saved.empty()) {
    DDP_THROW(CheckpointError, path, " holds SGD momentum buffers, but this optimizer is not SGD; resume with "
              "the optimizer that wrote it");
  }
}

namespace {

void restoreShardedState(ZeroRedundancyOptimizer& zero, const torch::nn::Module& module,
                         const checkpoint::NamedTensors& saved, const std::string& path, c10::Device device) {
  checkpoint::NamedTensors owned;
  std::map<std::string, bool> mine;
  for (const auto& item : module.named_parameters(true)) {
    if (zero.owns(item.value())) {
      owned.emplace_back(item.key(), item.value());
      mine[item.key()] = true;
    }
  }
  checkpoint::NamedTensors entries;
  for (const auto& [key, value] : saved) {
    const size_t dot = key.find('.');
    if (dot != std::string::npos && mine.count(key.substr(dot + 1))) entries.emplace_back(key, value);
  }
  torch::optim::Optimizer& local = zero.localOptimizer();
  if (auto* sgd = dynamic_cast<torch::optim::SGD*>(&local)) {
    if (checkpoint::holdsAdamMoments(saved)) {
      DDP_THROW(CheckpointError, path, " holds Adam/AdamW state, but this optimizer is SGD; resume with the "
                "optimizer that wrote it");
    }
    checkpoint::restoreSgdMomentumBuffers(*sgd, owned, entries, path);
  } else if (checkpoint::isAdam(local)) {
    if (!entries.empty() && !checkpoint::holdsAdamMoments(entries)) {
      DDP_THROW(CheckpointError, path, " holds SGD momentum buffers, but this optimizer is Adam/AdamW; resume "
                "with the optimizer that wrote it");
    }
    checkpoint::restoreAdamMoments(local, owned, entries, path);
  } else {
    DDP_THROW(ConfigError, "ddp::Checkpointer: a ZeroRedundancyOptimizer resumes SGD, Adam or AdamW state only");
  }
  (void)device;
}

}  // namespace
}  // namespace ddp::checkpoint
