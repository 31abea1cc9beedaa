#include "libddp/checkpoint/optimizer_state.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <map>
#include <mutex>

#include "common/error.h"
#include "libddp/torch_compat.h"

namespace ddp::checkpoint {
namespace {

constexpr const char* kPrefix = "momentum_buffer.";

// LibTorch keys per-parameter optimizer state by the parameter's TensorImpl address.
compat::OptimizerStateKey stateKey(const at::Tensor& param) { return compat::optimizerStateKey(param); }

constexpr const char* kAdamKeys[] = {"exp_avg.", "exp_avg_sq.", "max_exp_avg_sq.", "step."};

template <typename State>
void addAdamState(const State& st, const std::string& name, NamedTensors& out) {
  out.emplace_back(std::string("exp_avg.") + name, st.exp_avg().detach().cpu().clone());
  out.emplace_back(std::string("exp_avg_sq.") + name, st.exp_avg_sq().detach().cpu().clone());
  if (st.max_exp_avg_sq().defined() && st.max_exp_avg_sq().numel() > 0) {
    out.emplace_back(std::string("max_exp_avg_sq.") + name, st.max_exp_avg_sq().detach().cpu().clone());
  }
  out.emplace_back(std::string("step.") + name, at::scalar_tensor(st.step(), at::kLong));
}

template <typename State>
std::unique_ptr<State> makeAdamState(const std::map<std::string, at::Tensor>& entries, const at::Tensor& param,
                                     const std::string& name, const std::string& source) {
  auto get = [&](const char* prefix, bool required) -> at::Tensor {
    auto it = entries.find(prefix);
    if (it == entries.end()) {
      if (required) {
        DDP_THROW(CheckpointError, "'", source, "' has incomplete Adam state for '", name, "' (no ", prefix, name, ")");
      }
      return {};
    }
    if (std::string(prefix) != "step." && !it->second.sizes().equals(param.sizes())) {
      DDP_THROW(CheckpointError, "'", source, "' has Adam state of the wrong shape for '", name, "'");
    }
    return it->second;
  };
  auto st = std::make_unique<State>();
  const at::Tensor step = get("step.", true);
  st->step(step.item<int64_t>());
  st->exp_avg(get("exp_avg.", true).to(param.device(), param.scalar_type()).clone());
  st->exp_avg_sq(get("exp_avg_sq.", true).to(param.device(), param.scalar_type()).clone());
  if (at::Tensor m = get("max_exp_avg_sq.", false); m.defined()) {
    st->max_exp_avg_sq(m.to(param.device(), param.scalar_type()).clone());
  }
  return st;
}

}  // namespace

bool isAdam(const torch::optim::Optimizer& optimizer) {
  return dynamic_cast<const torch::optim::Adam*>(&optimizer) != nullptr ||
         dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr;
}

bool holdsAdamMoments(const NamedTensors& saved) {
  for (const auto& [key, value] : saved) {
    if (key.rfind("exp_avg.", 0) == 0 || key.rfind("step.", 0) == 0) return true;
  }
  return false;
}

NamedTensors adamMoments(torch::optim::Optimizer& optimizer, const NamedTensors& namedParams) {
  NamedTensors out;
  auto& state = optimizer.state();
  const bool adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr;
  for (const auto& [name, param] : namedParams) {
    auto it = state.find(stateKey(param));
    if (it == state.end()) continue;
    if (adamw) addAdamState(static_cast<torch::optim::AdamWParamState&>(*it->second), name, out);
    else addAdamState(static_cast<torch::optim::AdamParamState&>(*it->second), name, out);
  }
  return out;
}

void restoreAdamMoments(torch::optim::Optimizer& optimizer, const NamedTensors& namedParams,
                        const NamedTensors& saved, const std::string& source) {
  std::map<std::string, at::Tensor> byName(namedParams.begin(), namedParams.end());
  // parameter name → {prefix → tensor}
  std::map<std::string, std::map<std::string, at::Tensor>> perParam;
  for (const auto& [key, value] : saved) {
    for (const char* prefix : kAdamKeys) {
      if (key.rfind(prefix, 0) != 0) continue;
      const std::string name = key.substr(std::string(prefix).size());
      if (byName.count(name) == 0) {
        DDP_THROW(CheckpointError, "'", source, "' has optimizer state for unknown parameter '", name, "'");
      }
      perParam[name][prefix] = value;
      break;
    }
  }
  const bool adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr;
  auto& state = optimizer.state();
  for (const auto& [name, entries] : perParam) {
    const at::Tensor& param = byName.at(name);
    if (adamw) state[stateKey(param)] = makeAdamState<torch::optim::AdamWParamState>(entries, param, name, source);
    else state[stateKey(param)] = makeAdamState<torch::optim::AdamParamState>(entries, param, name, source);
  }
}

NamedTensors sgdMomentumBuffers(torch::optim::SGD& optimizer, const NamedTensors& namedParams) {
  NamedTensors out;
  auto& state = optimizer.state();
  for (const auto& [name, param] : namedParams) {
    auto it = state.find(stateKey(param));
    if (it == state.end()) continue;
    auto& sgd = static_cast<torch::optim::SGDParamState&>(*it->second);
    if (sgd.momentum_buffer().defined()) out.emplace_back(kPrefix + name, sgd.momentum_buffer().detach().cpu().clone());
  }
  return out;
}

void restoreSgdMomentumBuffers(torch::optim::SGD& optimizer, const NamedTensors& namedParams,
                               const NamedTensors& buffers, const std::string& source) {
  std::map<std::string, at::Tensor> byName(namedParams.begin(), namedParams.end());
  auto& state = optimizer.state();
  for (const auto& [key, buffer] : buffers) {
    if (key.rfind(kPrefix, 0) != 0) continue;
    const std::string name = key.substr(std::string(kPrefix).size());
    auto it = byName.find(name);
    if (it == byName.end()) {
      DDP_THROW(CheckpointError, "'", source, "' has optimizer state for unknown parameter '", name, "'");
    }
    if (!it->second.sizes().equals(buffer.sizes())) {
      DDP_THROW(CheckpointError, "'", source, "' has a momentum buffer of the wrong shape for '", name, "'");
    }
    auto sgd = std::make_unique<torch::optim::SGDParamState>();
    sgd->momentum_buffer(buffer.to(it->second.device(), it->second.scalar_type()).clone());
    state[stateKey(it->second)] = std::move(sgd);
  }
}

at::Tensor cpuRngState() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void setCpuRngState(const at::Tensor& state) {
  if (!state.defined()) return;
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

at::Tensor cudaRngState(c10::Device device) {
  if (!device.is_cuda()) return {};
  auto gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void setCudaRngState(c10::Device device, const at::Tensor& state) {
  if (!device.is_cuda() || !state.defined()) return;
  auto gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace ddp::checkpoint
