// model.name: gpt — nanoGPT's GPT (karpathy/nanoGPT model.py) in LibTorch: token and position
// embeddings, pre-norm blocks of causal self-attention and a 4x GELU MLP, a final LayerNorm and
// the LM head tied to the token embedding. Its state dict (gptStateDict) has nanoGPT's keys, so it
// loads into nanoGPT's GPT with load_state_dict(strict=True), and a nanoGPT ckpt.pt's 'model' loads
// here (loadGptStateDict).
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <ATen/core/Generator.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ddp/state_dict.h"
#include "worker/models/sharded_units.h"

namespace ddp::worker {

/// nanoGPT's GPTConfig; the names of the config keys are model.<snake_case of the field>.
struct GptOptions {
  int64_t nLayer = 12;       // model.n_layer: transformer blocks
  int64_t nHead = 12;        // model.n_head: attention heads; must divide nEmbd
  int64_t nEmbd = 768;       // model.n_embd: embedding width
  int64_t blockSize = 1024;  // model.block_size: the longest sequence (rows of wpe)
  int64_t vocabSize = 50304; // model.vocab_size: GPT-2's 50257 padded to a multiple of 64
  double dropout = 0.0;      // model.dropout: after the embeddings, on attention, after each residual branch
  bool bias = true;          // model.bias: biases in Linears and LayerNorms (GPT-2); false: none
};

/// ConfigError, one line naming the model.* key, for options nanoGPT's GPT could not be built with
/// (n_embd not divisible by n_head, sizes < 1, dropout outside [0, 1)).
void validateGptOptions(const GptOptions& options);

/// nanoGPT's LayerNorm: weight, and bias only when `bias`; eps 1e-5.
class GptLayerNormImpl : public torch::nn::Cloneable<GptLayerNormImpl> {
 public:
  GptLayerNormImpl(int64_t width, bool bias);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;
  at::Tensor bias;  // undefined without bias

 private:
  int64_t width_;
  bool hasBias_;
};
TORCH_MODULE(GptLayerNorm);

/// Causal self-attention: c_attn (q, k, v of every head in one Linear), scaled dot-product
/// attention with the causal mask, c_proj, dropout.
class GptAttentionImpl : public torch::nn::Cloneable<GptAttentionImpl> {
 public:
  explicit GptAttentionImpl(const GptOptions& options);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);

 private:
  GptOptions options_;
  torch::nn::Linear cAttn_{nullptr};
  torch::nn::Linear cProj_{nullptr};
};
TORCH_MODULE(GptAttention);

/// c_fc (4 x n_embd) -> exact GELU -> c_proj -> dropout.
class GptMlpImpl : public torch::nn::Cloneable<GptMlpImpl> {
 public:
  explicit GptMlpImpl(const GptOptions& options);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);

 private:
  GptOptions options_;
  torch::nn::Linear cFc_{nullptr};
  torch::nn::Linear cProj_{nullptr};
};
TORCH_MODULE(GptMlp);

/// x + attn(ln_1(x)), then x + mlp(ln_2(x)).
class GptBlockImpl : public torch::nn::Cloneable<GptBlockImpl> {
 public:
  explicit GptBlockImpl(const GptOptions& options);
  void reset() override;
  at::Tensor forward(at::Tensor x);

 private:
  GptOptions options_;
  GptLayerNorm ln1_{nullptr};
  GptAttention attn_{nullptr};
  GptLayerNorm ln2_{nullptr};
  GptMlp mlp_{nullptr};
};
TORCH_MODULE(GptBlock);

/// nanoGPT's `transformer` ModuleDict: wte, wpe, h.<i>, ln_f (its dropout has no state).
class GptTransformerImpl : public torch::nn::Cloneable<GptTransformerImpl> {
 public:
  explicit GptTransformerImpl(const GptOptions& options);
  void reset() override;

  torch::nn::Embedding wte{nullptr};
  torch::nn::Embedding wpe{nullptr};
  // Iterated, never mirrored in a member vector: clone() replaces the list's modules.
  torch::nn::ModuleList h{nullptr};
  GptLayerNorm lnF{nullptr};

 private:
  GptOptions options_;
};
TORCH_MODULE(GptTransformer);

/// nanoGPT's GPT. The LM head is the token embedding (logits = x · wteᵀ): only
/// transformer.wte.weight is registered, so parameters() holds it once (DDP reduces it once, the
/// optimizer steps it once) and Module::to() cannot untie it. Initialised as nanoGPT: Linear and
/// Embedding weights N(0, 0.02), biases 0, every c_proj.weight N(0, 0.02 / sqrt(2 n_layer)),
/// LayerNorm weight 1 and bias 0. ConfigError (validateGptOptions) on bad options.
/// train.sharding full: each block one unit (wte, wpe and ln_f stay with the root).
class GptImpl : public torch::nn::Cloneable<GptImpl>, public ShardedUnits {
 public:
  explicit GptImpl(GptOptions options);
  void reset() override;
  /// The blocks transformer.h.0, h.1, ... in order.
  std::vector<torch::nn::Module*> unitModules() override;

  /// Logits [B, T, vocab] of every position for tokens `idx` [B, T] (int64). ConfigError when
  /// T > block_size.
  at::Tensor forward(const at::Tensor& idx);
  /// ln_f's output [B, T, n_embd] (forward without the LM head).
  at::Tensor hidden(const at::Tensor& idx);

  /// nanoGPT's generate: `maxNewTokens` times, crop to the last block_size tokens, take the last
  /// position's logits / temperature, keep the `topK` largest (others -inf), sample one token from
  /// the softmax with `generator` (none: the default one) and append it. Returns [B, T +
  /// maxNewTokens]. No gradients; call eval() first to switch dropout off, as nanoGPT's sample.py.
  at::Tensor generate(at::Tensor idx, int64_t maxNewTokens, double temperature = 1.0,
                      std::optional<int64_t> topK = std::nullopt,
                      std::optional<at::Generator> generator = std::nullopt);

  /// nanoGPT's get_num_params: every parameter (the tied head counted once), less the position
  /// embedding when `nonEmbedding`.
  int64_t numParameters(bool nonEmbedding = true) const;
  /// nanoGPT's estimate_mfu numerator per token: 6 N + 12 L H Q T (N non-embedding parameters,
  /// Q = n_embd / n_head, T = block_size), forward and backward.
  double flopsPerToken() const;
  /// nanoGPT's estimate_mfu: the share of `peakFlops` (FLOP/s) reached when `tokensPerIter` tokens
  /// go forward and backward in `seconds`. nanoGPT's estimate_mfu(fwdbwd_per_iter, dt) is
  /// estimateMfu(fwdbwd_per_iter * block_size, dt, 312e12).
  double estimateMfu(double tokensPerIter, double seconds, double peakFlops) const;

  const GptOptions& options() const { return options_; }
  GptTransformer transformer{nullptr};

 private:
  GptOptions options_;
};
TORCH_MODULE(Gpt);

/// Mean cross entropy of `logits` [B, T, V] against `targets` [B, T] over every position, targets
/// -1 ignored (nanoGPT's loss).
at::Tensor gptLoss(const at::Tensor& logits, const at::Tensor& targets);

/// nanoGPT's configure_optimizers groups: parameters with dim >= 2 (matmul weights, embeddings)
/// are decayed, the rest (biases, LayerNorm weights) are not. Registration order, each tensor once.
struct GptParameterGroups {
  std::vector<at::Tensor> decay;
  std::vector<at::Tensor> noDecay;
};
GptParameterGroups gptParameterGroups(const Gpt& model);

/// nanoGPT's model.state_dict(): the module's parameters under nanoGPT's keys (CPU copies) plus
/// "lm_head.weight", the same tensor as "transformer.wte.weight".
ddp::StateDict gptStateDict(const GptImpl& model);
ddp::StateDict gptStateDict(const Gpt& model);

/// Loads nanoGPT's state dict into `model` (converted to its devices and dtypes). Keys may carry
/// "module." or "_orig_mod." prefixes (DDP, torch.compile); "lm_head.weight" may be absent, and
/// when present must equal "transformer.wte.weight". One CheckpointError lists every missing,
/// unexpected or misshaped key before anything changes; `source` (the file's path), when given,
/// begins its line.
void loadGptStateDict(GptImpl& model, ddp::StateDict state, const std::string& source = "");
void loadGptStateDict(Gpt& model, ddp::StateDict state);

/// The GPT settings a model file records of the run that wrote it, by nanoGPT's names ("n_layer",
/// "n_head", "n_embd", "block_size", "bias", "vocab_size"; values as text, bools "true"/"false"), and
/// where they come from ("its model_args", "its run's config").
struct RecordedGptSettings {
  std::map<std::string, std::string> values;
  std::string from;
};

/// CheckpointError, one line beginning with `source`, when a setting `recorded` holds differs from
/// `options`: nanoGPT's six that its train.py takes from a checkpoint it resumes (n_layer, n_head,
/// n_embd, block_size, bias, vocab_size; dropout may differ). n_head above all: no tensor's shape
/// shows it, so a file of another n_head would load and compute another model. Settings the file
/// does not record are not compared.
void checkGptSettings(const GptOptions& options, const RecordedGptSettings& recorded, const std::string& source);

}  // namespace ddp::worker
