#include "libddp/checkpoint/optimizer_state.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <torch/optim/sgd.h>

#include <map>
#include <mutex>

#include "common/error.h"
#include "common/torch_compat.h"

namespace ddp::checkpoint {
namespace {

constexpr const char* kPrefix = "momentum_buffer.";

// LibTorch keys per-parameter optimizer state by the parameter's TensorImpl address.
compat::OptimizerStateKey stateKey(const at::Tensor& param) { return compat::optimizerStateKey(param); }

}  // namespace

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
