// ddp::fullyShard and the autograd glue of FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_state.py):
// which unit is the root of a forward, the post-backward marker on a unit's inputs, the
// pre-backward hooks on its outputs and the final callback that ends every unit's backward.
#include "ddp/fully_shard.h"

#include <ATen/ops/clamp.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "common/error.h"
#include "libddp/checkpoint/state_dict_loader.h"
#include "libddp/distinct_tensors.h"
#include "libddp/fsdp/sharded_parameter.h"
#include "libddp/fsdp/unit.h"

namespace ddp {

namespace {

using Unit = FullyShardedUnit::Impl;

// The units of this process: what is sharded by whom, and the forward/backward in progress.
// Recursive: a unit dropped while a lock is held (the last handle) unregisters itself.
struct Registry {
  std::recursive_mutex mutex;
  std::unordered_map<const torch::nn::Module*, std::weak_ptr<Unit>> modules;
  struct Owner {
    std::weak_ptr<Unit> unit;
    std::string name;
    size_t index = 0;  // in the unit's parameters
  };
  std::unordered_map<const c10::TensorImpl*, Owner> params;
  std::unordered_map<int64_t, std::weak_ptr<Unit>> byId;
  int64_t nextId = 1;
  int depth = 0;                            // units inside their forward now
  std::vector<std::weak_ptr<Unit>> units;   // the units of the current forward, in forward order
  std::vector<std::weak_ptr<Unit>> ended;   // the same, in the order their forwards ended
  std::vector<std::weak_ptr<Unit>> previous;    // `units` of the forward before: forward prefetch's order
  std::vector<std::weak_ptr<Unit>> prefetched;  // the units this forward prefetched
  bool finalCallbackQueued = false;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: units may outlive static destruction order
  return *r;
}

std::shared_ptr<Unit> unitById(int64_t id) {
  Registry& r = registry();
  std::lock_guard<std::recursive_mutex> lock(r.mutex);
  auto it = r.byId.find(id);
  return it == r.byId.end() ? nullptr : it->second.lock();
}

// FSDP2's RegisterPostBackwardFunction: an identity on the unit's inputs whose backward runs once
// the gradients of those inputs are in, i.e. once the unit's backward is done.
struct PostBackward : torch::autograd::Function<PostBackward> {
  // The inputs as a TensorList: autograd's argument scan takes a std::vector for a non-tensor.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, int64_t unitId,
                                                at::TensorList inputs) {
    ctx->saved_data["unit"] = unitId;
    return inputs.vec();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (auto unit = unitById(ctx->saved_data["unit"].toInt())) unit->postBackward();
    grads.insert(grads.begin(), at::Tensor());  // none for unitId
    return grads;
  }
};

// FSDP2's _root_post_backward_final_callback: every unit of the forward ends its backward (those
// whose inputs needed no gradient, the root among them, reduce here), in forward order.
void finalCallback() {
  Registry& r = registry();
  std::vector<std::shared_ptr<Unit>> units;
  {
    std::lock_guard<std::recursive_mutex> lock(r.mutex);
    for (const auto& weak : r.units) {
      if (auto unit = weak.lock()) units.push_back(std::move(unit));
    }
    r.finalCallbackQueued = false;
  }
  for (const auto& unit : units) unit->postBackward();
  for (const auto& unit : units) unit->backward = Unit::Backward::kIdle;
  if (!units.empty()) units.front()->pool->drain();  // nothing kept past the backward
}

void preBackward(Unit& unit) {
  Registry& r = registry();
  {
    std::lock_guard<std::recursive_mutex> lock(r.mutex);
    if (!r.finalCallbackQueued) {
      torch::autograd::Engine::get_default_engine().queue_callback(finalCallback);
      r.finalCallbackQueued = true;
    }
  }
  unit.preBackward();
  if (!unit.options.backwardPrefetch) return;
  // FSDP2's _backward_prefetch: the unit whose forward ended just before this one's is the next
  // to run backward. Every rank starts it at the same point, so the collectives line up.
  std::shared_ptr<Unit> next;
  {
    std::lock_guard<std::recursive_mutex> lock(r.mutex);
    for (size_t i = 1; i < r.ended.size(); ++i) {
      if (r.ended[i].lock().get() == &unit) {
        next = r.ended[i - 1].lock();
        break;
      }
    }
  }
  if (next && next->backward == Unit::Backward::kIdle) next->startUnshard();
}

// FSDP1's forward_prefetch: `unit` started its forward as the k-th of this forward; the unit that
// came after the k-th in the forward before (when that was `unit` too) starts its all-gather now.
// Every rank runs the same forwards, so every rank starts the same gathers in the same order.
void forwardPrefetch(const std::shared_ptr<Unit>& unit, size_t k) {
  Registry& r = registry();
  std::shared_ptr<Unit> next;
  {
    std::lock_guard<std::recursive_mutex> lock(r.mutex);
    if (k + 1 >= r.previous.size() || r.previous[k].lock() != unit) return;
    next = r.previous[k + 1].lock();
    if (!next || next == unit || next->unsharded || next->gathering) return;
    r.prefetched.push_back(next);
  }
  next->startUnshard();
}

// The end of the outermost forward: a prefetched gather that no forward waited for (the model
// took another path this time) is finished and freed here; kept, it would hand the next forward
// the parameters from before the optimizer's step.
void dropUnusedPrefetches() {
  Registry& r = registry();
  std::vector<std::shared_ptr<Unit>> unused;
  {
    std::lock_guard<std::recursive_mutex> lock(r.mutex);
    for (const auto& weak : r.prefetched) {
      auto unit = weak.lock();
      if (unit && unit->gathering) unused.push_back(std::move(unit));
    }
    r.prefetched.clear();
  }
  for (const auto& unit : unused) unit->reshard();
}

// The parameters `module` brings to a new unit: its own and its submodules', but for those of
// submodules that are units already (FSDP2's managed modules), each tensor once.
void collectParameters(const torch::nn::Module& module, const std::string& prefix, bool top, Registry& r,
                       std::unordered_set<const c10::TensorImpl*>& seen, std::vector<std::string>& names,
                       std::vector<at::Tensor>& params) {
  if (!top) {
    auto it = r.modules.find(&module);
    if (it != r.modules.end() && !it->second.expired()) return;
  }
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    const std::string name = prefix + item.key();
    const at::Tensor& param = item.value();
    if (!seen.insert(param.unsafeGetTensorImpl()).second) continue;
    auto owner = r.params.find(param.unsafeGetTensorImpl());
    if (owner != r.params.end()) {
      if (auto unit = owner->second.unit.lock()) {
        DDP_THROW(ConfigError, "ddp::fullyShard(", module.name(), "): parameter '", name, "' is already sharded by the unit of ",
                  unit->module->name(), " (as '", owner->second.name,
                  "'): a parameter shared by two units. Shard the module that holds every use of it as one unit, "
                  "and shard child modules before their parents");
      }
    }
    if (param.dim() == 0) {
      DDP_THROW(ConfigError, "ddp::fullyShard(", module.name(), "): parameter '", name,
                "' has no dimension; fully sharded parameters are split on dim 0 (make it shape {1})");
    }
    names.push_back(name);
    params.push_back(param);
  }
  for (const auto& child : module.named_children()) {
    collectParameters(*child.value(), prefix + child.key() + ".", false, r, seen, names, params);
  }
}

}  // namespace

FullyShardedUnit fullyShard(torch::nn::Module& module, ProcessGroup group, FullyShardOptions options) {
  if (group.destroyed()) {
    DDP_THROW(ConfigError, "ddp::fullyShard(", module.name(),
              "): the process group was destroyed (ProcessGroup::destroy()); shard the model before the end");
  }
  Registry& r = registry();
  std::lock_guard<std::recursive_mutex> lock(r.mutex);
  auto known = r.modules.find(&module);
  if (known != r.modules.end() && !known->second.expired()) {
    DDP_THROW(ConfigError, "ddp::fullyShard(", module.name(), "): this module is a unit already (fullyShard was called on it "
              "before); shard each module once");
  }
  std::unordered_set<const c10::TensorImpl*> seen;
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  collectParameters(module, "", true, r, seen, names, params);
  for (size_t i = 1; i < params.size(); ++i) {
    if (params[i].scalar_type() != params[0].scalar_type() || params[i].device() != params[0].device()) {
      DDP_THROW(ConfigError, "ddp::fullyShard(", module.name(), "): parameter '", names[i], "' is ", params[i].scalar_type(),
                " on ", params[i].device(), " but '", names[0], "' is ", params[0].scalar_type(), " on ", params[0].device(),
                "; a unit's parameters share one dtype and device (shard them as separate units)");
    }
  }
  if (options.replicateParameters && options.reshardAfterForward.value_or(false)) {
    DDP_THROW(ConfigError, "ddp::fullyShard(", module.name(), "): replicateParameters (ZeRO-2) keeps the gathered "
              "parameters from forward to backward, but reshardAfterForward is true; leave reshardAfterForward unset");
  }
  const int64_t id = r.nextId++;
  auto unit = std::shared_ptr<Unit>(new Unit(module, group, options, names, params, id), [](Unit* u) {
    Registry& reg = registry();
    {
      std::lock_guard<std::recursive_mutex> guard(reg.mutex);
      reg.byId.erase(u->id);
      auto m = reg.modules.find(u->module);
      if (m != reg.modules.end() && m->second.expired()) reg.modules.erase(m);
      for (const auto& p : u->params) {
        auto it = reg.params.find(p.unsafeGetTensorImpl());
        if (it != reg.params.end() && it->second.unit.expired()) reg.params.erase(it);
      }
    }
    delete u;
  });
  r.modules[&module] = unit;
  r.byId[id] = unit;
  for (size_t i = 0; i < params.size(); ++i) r.params[params[i].unsafeGetTensorImpl()] = {unit, names[i], i};
  return FullyShardedUnit(unit);
}

FullyShardedUnit::FullyShardedUnit(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {
  if (!impl_) throw ConfigError("ddp::FullyShardedUnit: made from no unit; use ddp::fullyShard(module, group)");
}

std::vector<at::Tensor> FullyShardedUnit::beforeForward(const std::vector<at::Tensor>& inputs) {
  Registry& r = registry();
  const bool grad = c10::GradMode::is_enabled();
  size_t position = 0;  // among this forward's unit forwards
  {
    std::lock_guard<std::recursive_mutex> lock(r.mutex);
    impl_->rootOfForward = r.depth == 0;
    if (impl_->rootOfForward && grad) {
      // A new forward to differentiate: a backward that never ran (or threw) leaves nothing behind.
      for (const auto& weak : r.units) {
        if (auto unit = weak.lock()) unit->backward = Impl::Backward::kIdle;
      }
      r.previous = std::move(r.units);
      r.units.clear();
      r.ended.clear();
    }
    position = r.units.size();
    if (grad) r.units.push_back(impl_);
    ++r.depth;
  }
  try {
    impl_->unshard();
    if (grad && impl_->options.forwardPrefetch) forwardPrefetch(impl_, position);
  } catch (...) {
    std::lock_guard<std::recursive_mutex> lock(r.mutex);
    --r.depth;
    throw;
  }
  std::vector<at::Tensor> cast = inputs;
  if (impl_->options.paramDtype && impl_->options.castForwardInputs) {
    for (auto& t : cast) {
      if (t.defined() && t.is_floating_point() && t.scalar_type() != *impl_->options.paramDtype) t = t.to(*impl_->options.paramDtype);
    }
  }
  if (!grad) return cast;
  // The marker goes on the inputs that need a gradient (FSDP2: the others cannot tell when the
  // unit's backward ends; the final callback reduces those units).
  std::vector<at::Tensor> marked;
  std::vector<size_t> where;
  for (size_t i = 0; i < cast.size(); ++i) {
    if (cast[i].defined() && cast[i].requires_grad()) {
      marked.push_back(cast[i]);
      where.push_back(i);
    }
  }
  if (marked.empty()) return cast;
  const auto outputs = PostBackward::apply(impl_->id, at::TensorList(marked));
  for (size_t k = 0; k < where.size(); ++k) cast[where[k]] = outputs[k];
  return cast;
}

void FullyShardedUnit::afterForward(const std::vector<at::Tensor>& outputs) {
  Registry& r = registry();
  const bool grad = c10::GradMode::is_enabled();
  {
    std::lock_guard<std::recursive_mutex> lock(r.mutex);
    --r.depth;
    if (grad) r.ended.push_back(impl_);
  }
  if (impl_->rootOfForward) dropUnusedPrefetches();
  // Without autograd no backward follows: free them unless the user asked to keep them. ZeRO-2
  // keeps them for its backward.
  const bool keep = grad && impl_->options.replicateParameters;
  const bool reshardNow = !keep && impl_->options.reshardAfterForward.value_or(grad ? !impl_->rootOfForward : true);
  if (reshardNow) impl_->reshard();
  if (impl_->rootOfForward) impl_->pool->drain();  // nothing kept past the forward
  if (!grad) return;
  std::weak_ptr<Impl> weak = impl_;
  for (const auto& output : outputs) {
    if (!output.defined() || !output.requires_grad()) continue;
    output.register_hook([weak](const at::Tensor&) {
      if (auto unit = weak.lock()) preBackward(*unit);
    });
  }
}

void FullyShardedUnit::abandonForward() {
  Registry& r = registry();
  {
    std::lock_guard<std::recursive_mutex> lock(r.mutex);
    --r.depth;
  }
  if (impl_->rootOfForward) dropUnusedPrefetches();
  impl_->reshard();
  if (impl_->rootOfForward) impl_->pool->drain();
}

void FullyShardedUnit::setRequiresGradientSync(bool requiresSync, bool recurse) {
  impl_->requiresGradientSync = requiresSync;
  if (!recurse) return;
  Registry& r = registry();
  std::lock_guard<std::recursive_mutex> lock(r.mutex);
  std::function<void(const torch::nn::Module&)> visit = [&](const torch::nn::Module& m) {
    for (const auto& child : m.children()) {
      auto it = r.modules.find(child.get());
      if (it != r.modules.end()) {
        if (auto unit = it->second.lock()) unit->requiresGradientSync = requiresSync;
      }
      visit(*child);
    }
  };
  visit(*impl_->module);
}

at::Tensor clipGradNorm(const std::vector<at::Tensor>& given, double maxNorm, ProcessGroup& group) {
  if (!(maxNorm > 0) || !std::isfinite(maxNorm)) {
    DDP_THROW(ConfigError, "ddp::clipGradNorm: maxNorm must be a positive finite number (got ", maxNorm, ")");
  }
  const std::vector<at::Tensor> params = internal::distinctTensors(given);  // a tied weight counts once
  c10::NoGradGuard noGrad;
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  // Every rank takes part in the all-reduce, even one whose shards are all empty. A parameter of
  // no unit (DDP's, whole and equal on every rank: DTensor's Replicate) counts once, not size() times.
  const auto options = at::TensorOptions().dtype(at::kFloat).device(group.device());
  at::Tensor squares = at::zeros({1}, options), replicated = at::zeros({1}, options);
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    at::Tensor& sum = fsdp::shardOfParameter(p) ? squares : replicated;
    sum += at::linalg_vector_norm(p.grad(), 2.0).pow(2).to(sum.device(), at::kFloat);
  }
  group.allReduce(squares);
  const at::Tensor total = (squares + replicated).sqrt().squeeze(0);
  const at::Tensor coefficient = at::clamp((total + 1e-6).reciprocal() * maxNorm, c10::nullopt, 1.0);
  for (auto& g : grads) g.mul_(coefficient.to(g.device(), g.scalar_type()));
  return total;
}

namespace {
// The unit holding `param`, and its index there; no unit: null.
std::pair<std::shared_ptr<Unit>, size_t> ownerOf(const at::Tensor& param) {
  Registry& r = registry();
  std::lock_guard<std::recursive_mutex> lock(r.mutex);
  auto it = r.params.find(param.unsafeGetTensorImpl());
  if (it == r.params.end()) return {nullptr, 0};
  return {it->second.unit.lock(), it->second.index};
}
}  // namespace

StateDict fullStateDict(const torch::nn::Module& model) {
  c10::NoGradGuard noGrad;
  std::unordered_map<const Unit*, at::Tensor> gathered;  // each unit's full values, gathered once
  StateDict out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    auto [unit, index] = ownerOf(item.value());
    if (!unit) {
      out[item.key()] = item.value().detach().to(at::kCPU).contiguous().clone();
      continue;
    }
    auto it = gathered.find(unit.get());
    if (it == gathered.end()) {
      // From the shards in their own dtype (not paramDtype), in the order the parameters come:
      // the same on every rank.
      at::Tensor full = at::empty({unit->layout.fullNumel()}, unit->shardOptions());
      if (unit->layout.shardNumel() > 0) {
        CollectiveOptions options;
        options.label = "fullStateDict (" + unit->module->name() + ")";
        unit->layout.copyOut(unit->group.allGather(unit->packedShards(), options), full);
      }
      it = gathered.emplace(unit.get(), full).first;
    }
    out[item.key()] = unit->layout.fullView(it->second, index).to(at::kCPU).contiguous().clone();
  }
  for (const auto& item : model.named_buffers(/*recurse=*/true)) {
    out[item.key()] = item.value().detach().to(at::kCPU).contiguous().clone();
  }
  return out;
}

void loadFullStateDict(torch::nn::Module& model, const StateDict& given) {
  c10::NoGradGuard noGrad;
  // A DDP or DataParallel module's keys ("module.fc.weight") and torch.compile's ("_orig_mod.")
  // name the model's own, as ddp::loadModel reads them.
  const auto params = model.named_parameters(/*recurse=*/true);
  const auto buffers = model.named_buffers(/*recurse=*/true);
  StateDict state;
  for (const auto& [key, value] : given) {
    // A key that is the model's own stays (a submodule may itself be called "module").
    const bool own = params.find(key) != nullptr || buffers.find(key) != nullptr;
    state[own ? key : checkpoint::stripWrapperPrefix(key)] = value;
  }
  // Every key and shape first: a bad file changes nothing.
  auto entry = [&](const std::string& key, at::IntArrayRef shape) -> const at::Tensor& {
    auto it = state.find(key);
    if (it == state.end()) {
      DDP_THROW(ConfigError, "ddp::loadFullStateDict(", model.name(), "): the state dict has no '", key, "' (it holds ",
                state.size(), " entries); is it this model's?");
    }
    if (it->second.sizes() != shape) {
      DDP_THROW(ConfigError, "ddp::loadFullStateDict(", model.name(), "): '", key, "' is ", it->second.sizes(),
                " in the state dict but ", shape, " in the model");
    }
    return it->second;
  };
  for (const auto& item : params) {
    auto [unit, index] = ownerOf(item.value());
    entry(item.key(), unit ? at::IntArrayRef(unit->layout[index].fullShape) : item.value().sizes());
  }
  for (const auto& item : buffers) entry(item.key(), item.value().sizes());
  // Strict, as set_model_state_dict and load_state_dict are: a key the model does not have is
  // another model's (or a renamed module's) weight that would be dropped silently.
  std::vector<std::string> unexpected;
  for (const auto& [key, value] : state) {
    if (params.find(key) == nullptr && buffers.find(key) == nullptr) unexpected.push_back(key);
  }
  if (!unexpected.empty()) {
    DDP_THROW(ConfigError, "ddp::loadFullStateDict(", model.name(), "): the state dict has '", unexpected.front(), "'",
              unexpected.size() > 1 ? " and " + std::to_string(unexpected.size() - 1) + " more key(s)" : "",
              " that the model does not have; is it this model's?");
  }
  for (const auto& item : params) {
    auto [unit, index] = ownerOf(item.value());
    if (!unit) {
      item.value().copy_(state.at(item.key()));
      continue;
    }
    unit->reshard();
    unit->setShard(state.at(item.key()).to(unit->shardOptions()), index);
  }
  for (const auto& item : buffers) item.value().copy_(state.at(item.key()));
}

void FullyShardedUnit::unshard() { impl_->unshard(); }
void FullyShardedUnit::reshard() { impl_->reshard(); }
bool FullyShardedUnit::isSharded() const { return !impl_->unsharded; }
int64_t FullyShardedUnit::gatheredBytes() const { return static_cast<int64_t>(impl_->fullFlat.storage().nbytes()); }
const std::vector<std::string>& FullyShardedUnit::parameterNames() const { return impl_->names; }
std::vector<at::Tensor> FullyShardedUnit::parameters() const { return impl_->params; }
std::vector<int64_t> FullyShardedUnit::fullShape(size_t i) const {
  if (i >= impl_->params.size()) {
    DDP_THROW(ConfigError, "ddp::FullyShardedUnit::fullShape(", i, "): the unit of ", impl_->module->name(), " has ",
              impl_->params.size(), " parameters");
  }
  return impl_->layout[i].fullShape;
}
int64_t FullyShardedUnit::shardedNumel() const { return impl_->layout.shardNumel(); }
torch::nn::Module& FullyShardedUnit::module() const { return *impl_->module; }
const FullyShardOptions& FullyShardedUnit::options() const { return impl_->options; }
ProcessGroup& FullyShardedUnit::group() const { return impl_->group; }

}  // namespace ddp

namespace ddp::fsdp {
std::optional<ParameterShard> shardOfParameter(const at::Tensor& param) {
  auto [unit, index] = ownerOf(param);
  if (!unit) return std::nullopt;
  const ParamLayout& layout = unit->layout[index];
  ParameterShard out;
  out.fullShape = layout.fullShape;
  out.rowStart = std::min(layout.rows, static_cast<int64_t>(unit->group.rank()) * layout.chunkRows);
  out.rows = layout.localRows;
  out.gathered = unit->unsharded;
  out.unit = unit->module->name();
  return out;
}
}  // namespace ddp::fsdp
