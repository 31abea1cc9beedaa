#include "worker/models/gpt.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/nn/functional/loss.h>
#include <torch/version.h>

#include <cmath>
#include <limits>
#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "common/error.h"

namespace ddp::worker {
namespace {

at::Tensor maybeDropout(const at::Tensor& x, double p, bool training) {
  return training && p > 0 ? at::dropout(x, p, /*train=*/true) : x;
}

torch::nn::Linear linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

std::string describe(const GptOptions& o) {
  return ::ddp::detail::concat("n_layer ", o.nLayer, ", n_head ", o.nHead, ", n_embd ", o.nEmbd, ", block_size ", o.blockSize,
                        ", vocab_size ", o.vocabSize, ", bias ", o.bias ? "true" : "false");
}

// The sizes a GPT state dict shows (all but n_head, which no tensor's shape holds), as model.* keys;
// "" when it is not one (no 2-D transformer.wte.weight / transformer.wpe.weight).
std::string describeFile(const std::map<std::string, at::Tensor>& given) {
  const auto wte = given.find("transformer.wte.weight");
  const auto wpe = given.find("transformer.wpe.weight");
  if (wte == given.end() || wpe == given.end() || wte->second.dim() != 2 || wpe->second.dim() != 2) return "";
  int64_t layers = 0;
  const std::string prefix = "transformer.h.";
  for (const auto& [key, value] : given) {
    if (key.rfind(prefix, 0) != 0) continue;
    try {
      layers = std::max<int64_t>(layers, std::stoll(key.substr(prefix.size())) + 1);
    } catch (const std::exception&) {
    }
  }
  const bool bias = given.count("transformer.h.0.attn.c_attn.bias") != 0;
  return ::ddp::detail::concat("model.n_layer=", layers, " model.n_embd=", wte->second.size(1), " model.block_size=",
                               wpe->second.size(0), " model.vocab_size=", wte->second.size(0), " model.bias=",
                               bias ? "true" : "false");
}

std::string shapeOf(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

// "module." (DDP) and "_orig_mod." (torch.compile) in any order, as nanoGPT's sample.py strips them.
std::string plainKey(std::string key) {
  for (bool stripped = true; stripped;) {
    stripped = false;
    for (const std::string prefix : {"module.", "_orig_mod."}) {
      if (key.rfind(prefix, 0) == 0) {
        key.erase(0, prefix.size());
        stripped = true;
      }
    }
  }
  return key;
}

// A whole wrong-sized model would make a line of hundreds of keys.
std::string joinList(const std::vector<std::string>& items, size_t limit = 32) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < limit; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > limit) out += ", ... (" + std::to_string(items.size() - limit) + " more)";
  return out;
}

}  // namespace

void validateGptOptions(const GptOptions& o) {
  const std::pair<const char*, int64_t> sizes[] = {{"model.n_layer", o.nLayer}, {"model.n_head", o.nHead},
                                                   {"model.n_embd", o.nEmbd},   {"model.block_size", o.blockSize},
                                                   {"model.vocab_size", o.vocabSize}};
  for (const auto& [key, value] : sizes) {
    if (value < 1) DDP_THROW(ConfigError, "config: ", key, " (", value, ") must be at least 1");
  }
  if (o.nEmbd % o.nHead != 0) {
    const int64_t below = o.nEmbd - o.nEmbd % o.nHead;
    const int64_t above = below + o.nHead;
    const std::string suggestion = below > 0 ? ::ddp::detail::concat(below, " or ", above) : std::to_string(above);
    DDP_THROW(ConfigError, "config: model.n_embd (", o.nEmbd, ") must be divisible by model.n_head (", o.nHead,
              "): each head gets n_embd / n_head channels; use e.g. model.n_embd: ", suggestion);
  }
  if (!(o.dropout >= 0 && o.dropout < 1)) {
    DDP_THROW(ConfigError, "config: model.dropout (", o.dropout, ") must be in [0, 1); 0 switches it off");
  }
}

GptLayerNormImpl::GptLayerNormImpl(int64_t width, bool bias) : width_(width), hasBias_(bias) { reset(); }

void GptLayerNormImpl::reset() {
  weight = register_parameter("weight", at::ones({width_}));
  if (hasBias_) bias = register_parameter("bias", at::zeros({width_}));
}

at::Tensor GptLayerNormImpl::forward(const at::Tensor& x) {
  return at::layer_norm(x, {width_}, weight, bias, 1e-5);
}

GptAttentionImpl::GptAttentionImpl(const GptOptions& options) : options_(options) { reset(); }

void GptAttentionImpl::reset() {
  cAttn_ = register_module("c_attn", linear(options_.nEmbd, 3 * options_.nEmbd, options_.bias));
  cProj_ = register_module("c_proj", linear(options_.nEmbd, options_.nEmbd, options_.bias));
}

at::Tensor GptAttentionImpl::forward(const at::Tensor& x) {
  const int64_t batch = x.size(0), time = x.size(1), width = x.size(2), heads = options_.nHead;
  const auto qkv = cAttn_->forward(x).split(width, 2);
  // [B, T, C] -> [B, heads, T, C / heads]
  const auto perHead = [&](const at::Tensor& t) { return t.view({batch, time, heads, width / heads}).transpose(1, 2); };
  const at::Tensor q = perHead(qkv[0]), k = perHead(qkv[1]), v = perHead(qkv[2]);
  const double p = is_training() ? options_.dropout : 0.0;
#if TORCH_VERSION_MAJOR >= 2
  at::Tensor y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, p, /*is_causal=*/true);
#else  // LibTorch 1.13: nanoGPT's slow path
  const at::Tensor future = at::ones({time, time}, x.options().dtype(at::kBool)).triu(1);
  at::Tensor att = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(k.size(-1))));
  att = maybeDropout(at::softmax(att.masked_fill(future, -std::numeric_limits<double>::infinity()), -1), p, p > 0);
  at::Tensor y = at::matmul(att, v);
#endif
  y = y.transpose(1, 2).contiguous().view({batch, time, width});
  return maybeDropout(cProj_->forward(y), options_.dropout, is_training());
}

GptMlpImpl::GptMlpImpl(const GptOptions& options) : options_(options) { reset(); }

void GptMlpImpl::reset() {
  cFc_ = register_module("c_fc", linear(options_.nEmbd, 4 * options_.nEmbd, options_.bias));
  cProj_ = register_module("c_proj", linear(4 * options_.nEmbd, options_.nEmbd, options_.bias));
}

at::Tensor GptMlpImpl::forward(const at::Tensor& x) {
  return maybeDropout(cProj_->forward(at::gelu(cFc_->forward(x))), options_.dropout, is_training());
}

GptBlockImpl::GptBlockImpl(const GptOptions& options) : options_(options) { reset(); }

void GptBlockImpl::reset() {
  ln1_ = register_module("ln_1", GptLayerNorm(options_.nEmbd, options_.bias));
  attn_ = register_module("attn", GptAttention(options_));
  ln2_ = register_module("ln_2", GptLayerNorm(options_.nEmbd, options_.bias));
  mlp_ = register_module("mlp", GptMlp(options_));
}

at::Tensor GptBlockImpl::forward(at::Tensor x) {
  x = x + attn_->forward(ln1_->forward(x));
  return x + mlp_->forward(ln2_->forward(x));
}

GptTransformerImpl::GptTransformerImpl(const GptOptions& options) : options_(options) { reset(); }

void GptTransformerImpl::reset() {
  wte = register_module("wte", torch::nn::Embedding(options_.vocabSize, options_.nEmbd));
  wpe = register_module("wpe", torch::nn::Embedding(options_.blockSize, options_.nEmbd));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < options_.nLayer; ++i) h->push_back(GptBlock(options_));
  lnF = register_module("ln_f", GptLayerNorm(options_.nEmbd, options_.bias));
}

GptImpl::GptImpl(GptOptions options) : options_(options) {
  validateGptOptions(options_);
  reset();
}

void GptImpl::reset() {
  transformer = register_module("transformer", GptTransformer(options_));
  c10::NoGradGuard noGrad;
  for (const auto& module : modules(/*include_self=*/false)) {
    if (auto* fc = module->as<torch::nn::Linear>()) {
      fc->weight.normal_(0.0, 0.02);
      if (fc->bias.defined()) fc->bias.zero_();
    } else if (auto* embedding = module->as<torch::nn::Embedding>()) {
      embedding->weight.normal_(0.0, 0.02);
    }
  }
  // GPT-2's scaled init of the projections into the residual stream.
  const double residualStd = 0.02 / std::sqrt(2.0 * static_cast<double>(options_.nLayer));
  const std::string suffix = "c_proj.weight";
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      item.value().normal_(0.0, residualStd);
    }
  }
}

at::Tensor GptImpl::hidden(const at::Tensor& idx) {
  if (idx.dim() != 2) {
    DDP_THROW(Error, "gpt: the input must be token ids [batch, time], got a tensor of shape ", shapeOf(idx));
  }
  const int64_t time = idx.size(1);
  if (time > options_.blockSize) {
    DDP_THROW(ConfigError, "config: a sequence of ", time, " tokens does not fit model.block_size (",
              options_.blockSize, "); raise model.block_size to ", time, " or feed at most ", options_.blockSize,
              " tokens");
  }
  const at::Tensor pos = at::arange(time, idx.options().dtype(at::kLong));
  at::Tensor x = transformer->wte->forward(idx) + transformer->wpe->forward(pos);
  x = maybeDropout(x, options_.dropout, is_training());
  for (size_t i = 0; i < transformer->h->size(); ++i) {
    auto* block = transformer->h[i]->as<GptBlockImpl>();
    x = runUnit(i, [block](const at::Tensor& in) { return block->forward(in); }, x);
  }
  return transformer->lnF->forward(x);
}

std::vector<torch::nn::Module*> GptImpl::unitModules() {
  std::vector<torch::nn::Module*> blocks;
  for (const auto& block : *transformer->h) blocks.push_back(block.get());
  return blocks;
}

at::Tensor GptImpl::forward(const at::Tensor& idx) {
  return at::linear(hidden(idx), transformer->wte->weight);  // the tied LM head
}

at::Tensor GptImpl::generate(at::Tensor idx, int64_t maxNewTokens, double temperature, std::optional<int64_t> topK,
                             std::optional<at::Generator> generator) {
  if (!(temperature > 0)) {
    DDP_THROW(ConfigError, "config: generate.temperature (", temperature, ") must be > 0; 1.0 samples as trained");
  }
  if (topK && *topK < 1) DDP_THROW(ConfigError, "config: generate.top_k (", *topK, ") must be at least 1");
  c10::optional<at::Generator> draws;  // LibTorch 1.13's optional is c10's own
  if (generator) draws = *generator;
  c10::NoGradGuard noGrad;
  for (int64_t i = 0; i < maxNewTokens; ++i) {
    const int64_t time = idx.size(1);
    const at::Tensor context = time <= options_.blockSize ? idx : idx.slice(1, time - options_.blockSize);
    // The head on the last position only, as nanoGPT does at inference.
    at::Tensor logits = at::linear(hidden(context).select(1, -1), transformer->wte->weight) / temperature;
    if (topK) {
      const int64_t k = std::min(*topK, logits.size(-1));
      const at::Tensor kth = std::get<0>(logits.topk(k, -1)).narrow(-1, k - 1, 1);
      logits = logits.masked_fill(logits < kth, -std::numeric_limits<double>::infinity());
    }
    const at::Tensor next = at::multinomial(at::softmax(logits, -1), 1, /*replacement=*/false, draws);
    idx = at::cat({idx, next}, 1);
  }
  return idx;
}

int64_t GptImpl::numParameters(bool nonEmbedding) const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return nonEmbedding ? n - transformer->wpe->weight.numel() : n;
}

double GptImpl::flopsPerToken() const {
  const double n = static_cast<double>(numParameters());
  const double layers = options_.nLayer, heads = options_.nHead, headWidth = options_.nEmbd / options_.nHead;
  return 6 * n + 12 * layers * heads * headWidth * static_cast<double>(options_.blockSize);
}

double GptImpl::estimateMfu(double tokensPerIter, double seconds, double peakFlops) const {
  return flopsPerToken() * tokensPerIter / seconds / peakFlops;
}

at::Tensor gptLoss(const at::Tensor& logits, const at::Tensor& targets) {
  namespace F = torch::nn::functional;
  return F::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}),
                          F::CrossEntropyFuncOptions().ignore_index(-1));
}

GptParameterGroups gptParameterGroups(const Gpt& model) {
  GptParameterGroups groups;
  std::set<const c10::TensorImpl*> seen;
  for (const auto& p : model->parameters()) {
    if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    (p.dim() >= 2 ? groups.decay : groups.noDecay).push_back(p);
  }
  return groups;
}

ddp::StateDict gptStateDict(const GptImpl& model) {
  ddp::StateDict state = ddp::stateDict(model);
  state["lm_head.weight"] = state.at("transformer.wte.weight");
  return state;
}

ddp::StateDict gptStateDict(const Gpt& model) { return gptStateDict(*model); }

void loadGptStateDict(Gpt& model, ddp::StateDict state) { loadGptStateDict(*model, std::move(state)); }

void loadGptStateDict(GptImpl& model, ddp::StateDict state, const std::string& source) {
  static const std::string kHead = "lm_head.weight", kWte = "transformer.wte.weight";
  std::map<std::string, at::Tensor> given;
  std::vector<std::string> duplicated, missing, unexpected, shapes;
  for (auto& [key, tensor] : state) {
    if (!given.emplace(plainKey(key), std::move(tensor)).second) duplicated.push_back(key);
  }
  at::Tensor head;
  if (auto it = given.find(kHead); it != given.end()) {
    head = it->second;
    given.erase(it);
  }
  std::map<std::string, at::Tensor> targets;
  for (const auto& item : model.named_parameters()) targets[item.key()] = item.value();
  for (const auto& item : model.named_buffers()) targets[item.key()] = item.value();
  for (const auto& [key, target] : targets) {
    auto it = given.find(key);
    if (it == given.end()) {
      missing.push_back(key + " " + shapeOf(target));
    } else if (!it->second.sizes().equals(target.sizes())) {
      shapes.push_back(key + " " + shapeOf(it->second) + " in the file vs " + shapeOf(target) + " in the model");
    }
  }
  for (const auto& [key, value] : given) {
    if (!targets.count(key)) unexpected.push_back(key);
  }
  if (missing.size() == targets.size() && !given.empty()) {  // not one GPT key: another model's file
    std::vector<std::string> theirs;
    for (const auto& [key, value] : given) theirs.push_back(key);
    DDP_THROW(CheckpointError, source.empty() ? std::string() : "'" + source + "': ", "not a GPT's state dict: none of its ",
              given.size(), " keys (", joinList(theirs, 3), ") is a GPT's (transformer.wte.weight, transformer.h.0..., "
              "lm_head.weight); give a model file a gpt run exported, or a nanoGPT ckpt.pt");
  }
  if (!duplicated.empty() || !missing.empty() || !unexpected.empty() || !shapes.empty()) {
    std::string message = (source.empty() ? std::string() : "'" + source + "': ") +
                          "the GPT state dict does not fit the model (" + describe(model.options()) + "):";
    if (!missing.empty()) message += " missing keys: " + joinList(missing) + ";";
    if (!unexpected.empty()) message += " unexpected keys: " + joinList(unexpected) + ";";
    if (!shapes.empty()) message += " shape differences: " + joinList(shapes) + ";";
    if (!duplicated.empty()) message += " keys twice (with and without a prefix): " + joinList(duplicated) + ";";
    const std::string file = describeFile(given);
    if (file.empty()) {
      message += " set model.* as the checkpoint's model_args (n_layer, n_head, n_embd, block_size, vocab_size, bias)";
    } else {  // the sizes the file shows: what to set (n_head from the run that wrote it)
      message += " the file's GPT has " + file + " (and the n_head of the run that wrote it): set model.* to those";
    }
    throw CheckpointError(message);
  }
  const at::Tensor& wte = given.at(kWte);
  if (head.defined() && !(head.sizes().equals(wte.sizes()) && at::equal(head.to(wte.options()), wte))) {
    DDP_THROW(CheckpointError, "the GPT state dict's lm_head.weight differs from its transformer.wte.weight, but this "
              "GPT ties them (nanoGPT's weight tying); the file is not a tied GPT's state dict");
  }
  c10::NoGradGuard noGrad;
  for (auto& [key, target] : targets) target.copy_(given.at(key));
}

void checkGptSettings(const GptOptions& options, const RecordedGptSettings& recorded, const std::string& source) {
  const std::pair<const char*, std::string> ours[] = {
      {"n_layer", std::to_string(options.nLayer)},     {"n_head", std::to_string(options.nHead)},
      {"n_embd", std::to_string(options.nEmbd)},       {"block_size", std::to_string(options.blockSize)},
      {"bias", options.bias ? "true" : "false"},       {"vocab_size", std::to_string(options.vocabSize)}};
  std::string differences, fix;
  for (const auto& [key, value] : ours) {
    const auto it = recorded.values.find(key);
    if (it == recorded.values.end() || it->second == value) continue;
    if (!differences.empty()) differences += ", ";
    differences.append(key).append(" ").append(it->second).append(" vs ").append(value);
    fix.append(" model.").append(key).append("=").append(it->second);
  }
  if (differences.empty()) return;
  const bool heads = recorded.values.count("n_head") && recorded.values.at("n_head") != std::to_string(options.nHead);
  DDP_THROW(CheckpointError, source.empty() ? std::string() : "'" + source + "': ", "the GPT that wrote it differs from "
            "this run's model.* (", recorded.from, " vs this run's): ", differences,
            heads ? " (n_head shapes no tensor: the weights would load and compute another model)" : "",
            "; set", fix);
}

}  // namespace ddp::worker
