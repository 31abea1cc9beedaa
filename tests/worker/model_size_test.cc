// What the worker's "does it fit" checks count before any tensor exists: the parameters of the
// model makeModel builds (counted from the built model), the state a training rank keeps per
// parameter under each optimizer and train.sharding, and a GPT's activations on the CPU (the
// tensors its block keeps for the backward, docs/worker.md).
#include <gtest/gtest.h>

#include <string>

#include <torch/version.h>

#include "common/error.h"
#include "worker/models/model_size.h"
#include "worker/models/models.h"

namespace ddp::worker {
namespace {

double builtParameters(const ModelConfig& config, const InputSpec& input) {
  double count = 0;
  for (const auto& p : makeModel(config, input).ptr()->parameters()) count += static_cast<double>(p.numel());
  return count;
}

ModelConfig smallGpt(bool bias) {
  ModelConfig m;
  m.name = "gpt";
  m.nLayer = 3;
  m.nHead = 2;
  m.nEmbd = 16;
  m.blockSize = 12;
  m.vocabSize = 37;
  m.bias = bias;
  return m;
}

TEST(ModelSize, ParameterCountIsWhatMakeModelBuilds) {
  const InputSpec image{1, 28, 28, 10};
  ModelConfig mlp;
  mlp.name = "mlp";
  mlp.hidden = {64, 32};
  ModelConfig cnn;
  cnn.batchNorm = true;
  ModelConfig unused = mlp;
  unused.unusedLayer = true;
  for (const ModelConfig& m : {mlp, cnn, unused, smallGpt(true), smallGpt(false)}) {
    const InputSpec input = m.name == "gpt" ? InputSpec{1, 1, 12, 37} : image;
    EXPECT_EQ(parameterCount(m, input), builtParameters(m, input)) << m.name << (m.bias ? "" : " without bias");
  }
}

TEST(ModelSize, TrainingStateFollowsTheOptimizerAndTheSharding) {
  WorkerConfig c;
  c.model.name = "mlp";
  c.model.hidden = {64};
  const InputSpec input{1, 28, 28, 10};
  const double p = parameterCount(c.model, input);
  const auto perParameter = [&](int world) { return trainingMemory(c, input, world, true).state / p; };
  c.train.optimizer = "sgd";
  c.train.momentum = 0.9;
  EXPECT_EQ(perParameter(1), 12);  // weights, gradients, momentum
  EXPECT_TRUE(c.comm.ddp.gradientAsBucketView);  // the worker's default: the gradients are the buckets
  EXPECT_EQ(perParameter(2), 12);
  c.comm.ddp.gradientAsBucketView = false;
  EXPECT_EQ(perParameter(2), 16);  // and the reducer's bucket copy
  c.train.momentum = 0;
  EXPECT_EQ(perParameter(1), 8);
  c.train.optimizer = "adamw";
  EXPECT_EQ(perParameter(1), 16);  // exp_avg and exp_avg_sq
  EXPECT_EQ(perParameter(4), 20);
  c.comm.ddp.reducer = GradientReducer::kFlat;  // its buffer only after backward, the activations gone
  EXPECT_EQ(perParameter(4), 16);
  c.comm.ddp.reducer = GradientReducer::kBucketed;
  c.train.sharding = Sharding::kZero1;  // whole tensors handed out greedily: a rank's share unknown
  EXPECT_EQ(perParameter(4), 4 * (1 + 1 + 0 + 1));
  EXPECT_EQ(perParameter(1), 16);
  c.train.sharding = Sharding::kZero2;
  EXPECT_EQ(perParameter(4), 4 * (1 + 1.0 / 4 + 2.0 / 4));
  c.train.sharding = Sharding::kFull;
  EXPECT_EQ(perParameter(2), 4 * (4.0 / 2));
  EXPECT_EQ(perParameter(8), 4);  // never below the whole weights each rank builds first
  EXPECT_EQ(trainingMemory(c, input, 8, true).activations, 0);  // not counted for an MLP
  EXPECT_EQ(trainingMemory(c, input, 8, false).state, 4 * p);   // on GPUs: the weights the host builds
  c.model.name = "torchscript";
  EXPECT_EQ(parameterCount(c.model, input), 0);  // its file alone knows
}

TEST(ModelSize, AGptsActivationsOnTheCpu) {
  WorkerConfig c;
  c.model = smallGpt(false);
  c.train.batchSize = 5;
  const InputSpec input{1, 1, 12, 37};
  const double tokens = 5 * 12, channels = 16, layers = 3, vocab = 37;
#if TORCH_VERSION_MAJOR >= 2
  const double attention = 0;
#else
  const double attention = 2 * 12;  // LibTorch 1.x's math attention: n_head · block_size a token and layer
#endif
  EXPECT_EQ(trainingMemory(c, input, 1, true).activations,
            tokens * 4 * (layers * (16 * channels + attention) + 2 * channels + 2 * vocab));
  EXPECT_EQ(trainingMemory(c, input, 1, false).activations, 0);  // on a GPU: the GPU's memory
  c.train.activationCheckpointing = true;
  EXPECT_EQ(trainingMemory(c, input, 1, true).activations,
            tokens * 4 * ((layers + 16) * channels + attention + 2 * channels + 2 * vocab));
  c.train.precision = "bf16";
  EXPECT_EQ(trainingMemory(c, input, 1, true).activations,
            tokens * 2 * ((layers + 16) * channels + attention + 2 * channels + 2 * vocab));
}

TEST(ModelSize, TheLineNamesWhatDominatesAndTheLimit) {
  WorkerConfig c;
  c.model = smallGpt(false);
  c.train.optimizer = "adamw";
  c.train.batchSize = 100000;
  const InputSpec input{1, 1, 12, 37};
  const MemoryLimit limit{1024.0 * 1024 * 1024, "/sys/fs/cgroup/job/memory.max"};
  try {
    checkTrainingFits(c, input, 2, 2, true, limit);
    FAIL() << "a batch of 100000 windows fitted in 1 GiB";
  } catch (const ConfigError& e) {
    const std::string line = e.what();
    EXPECT_NE(line.find("the activations of 100000 windows of 12 tokens"), std::string::npos) << line;
    EXPECT_NE(line.find("for the 2 ranks on this host, but this process may use 1 GiB (the cgroup limit in "
                        "/sys/fs/cgroup/job/memory.max); use a smaller train.batch_size"), std::string::npos) << line;
  }
  c.train.batchSize = 1;
  c.model.nLayer = 4000;
  c.model.nEmbd = 512;
  c.model.nHead = 8;
  try {
    checkTrainingFits(c, input, 2, 2, true, limit);
    FAIL() << "4000 layers of 512 fitted in 1 GiB";
  } catch (const ConfigError& e) {
    const std::string line = e.what();
    EXPECT_NE(line.find("(weights, gradients, optimizer state 188 GiB; the activations of 1 windows"), std::string::npos)
        << line;
    EXPECT_NE(line.find("use smaller model.n_layer / model.n_embd, or train.sharding: full"), std::string::npos) << line;
  }
  try {
    checkTrainingFits(c, input, 2, 2, false, limit);  // on GPUs: the weights the host builds
    FAIL() << "4000 layers of 512 fitted in 1 GiB";
  } catch (const ConfigError& e) {
    const std::string line = e.what();
    EXPECT_NE(line.find("training needs about 46.9 GiB per rank (the weights it builds before they move to the GPU)"),
              std::string::npos) << line;
    EXPECT_NE(line.find("; use smaller model.n_layer / model.n_embd"), std::string::npos) << line;
    EXPECT_EQ(line.find("sharding"), std::string::npos) << line;
  }
  EXPECT_NO_THROW(checkTrainingFits(c, input, 2, 2, false, MemoryLimit{0, ""}));  // unknown: no check
}

}  // namespace
}  // namespace ddp::worker
