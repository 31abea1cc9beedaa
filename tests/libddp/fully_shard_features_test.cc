// ddp::fullyShard's other parts against DDP and by formula: reshardAfterForward frees the
// gathered bytes, a unit run twice in a forward, the full state dict (export and load),
// evaluation without autograd, accumulation without gradient sync, clipping by the global norm,
// activation checkpointing inside units,
// ddp::FullyShard<Model>, and misuse as one line. The helpers: fully_shard_test_support.h.
#include "tests/libddp/fully_shard_test_support.h"

namespace fsdp_test {
namespace {

// kSteps of SGD on DDP over `plain` and on the sharded `model`, the same batches, each step's
// loss computed by `loss` from the model's forward (DDP's or the sharded one), x and y.
using Forward = std::function<torch::Tensor(const torch::Tensor&)>;
using StepLoss = std::function<torch::Tensor(const Forward&, const torch::Tensor&, const torch::Tensor&)>;
void trainSideBySide(Net plain, Sharded& model, const StepLoss& loss) {
  ddp::DistributedDataParallel<Net> ddpModel(plain, group());
  auto ddpOptimizer = sgd()(plain->parameters());
  auto optimizer = sgd()(model.net->parameters());
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = batch(s, group().rank());
    ddpOptimizer->zero_grad();
    loss([&](const torch::Tensor& in) { return ddpModel(in); }, x, y).backward();
    ddpOptimizer->step();
    optimizer->zero_grad();
    loss([&](const torch::Tensor& in) { return model.forward(in); }, x, y).backward();
    optimizer->step();
  }
}

torch::Tensor mseLoss(const Forward& forward, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::mse_loss(forward(x), y);
}

TEST(FullyShard, ReshardAfterForwardFreesTheGatheredBytes) {
  Sharded model;
  std::optional<c10::Storage> gathered;  // the block's full buffer, seen from inside its forward
  std::vector<int64_t> shapeInForward;
  model.net->runBlock = [&](size_t i, const torch::Tensor& x) {
    return model.blocks[i].forward([&](const torch::Tensor& h) {
      if (i == 0) {
        gathered = model.net->block(0)->fc1->weight.storage();
        shapeInForward = model.net->block(0)->fc1->weight.sizes().vec();
      }
      return model.net->block(i)->forward(h);
    }, x);
  };
  auto [x, y] = batch(0, group().rank());
  const torch::Tensor loss = torch::mse_loss(model.forward(x), y);
  EXPECT_EQ(shapeInForward, (std::vector<int64_t>{4, 7}));
  ASSERT_TRUE(gathered.has_value());
  EXPECT_EQ(gathered->nbytes(), 0u) << "a block's gathered parameters are freed after its forward";
  EXPECT_TRUE(model.blocks[0].isSharded());
  EXPECT_FALSE(model.root->isSharded()) << "the root keeps its parameters for backward (FSDP2's default)";
  loss.backward();
  EXPECT_EQ(gathered->nbytes(), 0u) << "and again after backward";
  EXPECT_TRUE(model.blocks[0].isSharded());
  EXPECT_TRUE(model.root->isSharded());
  const int64_t c = (4 + group().size() - 1) / group().size();
  EXPECT_EQ(model.net->block(0)->fc1->weight.size(0), std::clamp<int64_t>(4 - group().rank() * c, 0, c));
}

// A unit whose forward runs twice in one step (block 0 applied twice): gathered and reduced for
// each use, as FSDP2, and still DDP's result; under ZeRO-2 too.
TEST(FullyShard, UnitRunTwiceInOneForward) {
  for (const ddp::FullyShardOptions& options : {ddp::FullyShardOptions{}, zero2()}) {
    SCOPED_TRACE(options.replicateParameters ? "zero2" : "full");
    Net plain = makeNet();
    plain->runBlock = [&](size_t i, const torch::Tensor& x) {
      return i == 0 ? plain->block(0)->forward(plain->block(0)->forward(x)) : plain->block(i)->forward(x);
    };
    Sharded model(options);
    auto runBlock = model.net->runBlock;
    model.net->runBlock = [&](size_t i, const torch::Tensor& x) { return i == 0 ? runBlock(0, runBlock(0, x)) : runBlock(i, x); };
    trainSideBySide(plain, model, mseLoss);
    Params expected;
    for (const auto& p : plain->named_parameters()) expected[p.key()] = p.value().detach().clone();
    EXPECT_LE(maxDiff(model.fullParameters(), expected), 1e-5);
  }
}

// Two forwards of the whole model, then one backward over both losses (two views of a batch, as
// contrastive training does): FSDP2 runs this step; the result is DDP's on the same step.
TEST(FullyShard, TwoForwardsThenOneBackwardEqualDdp) {
  for (const ddp::FullyShardOptions& options : {ddp::FullyShardOptions{}, zero2()}) {
    SCOPED_TRACE(options.replicateParameters ? "zero2" : "full");
    Net plain = makeNet();
    Sharded model(options);
    trainSideBySide(plain, model, [](const Forward& forward, const torch::Tensor& x, const torch::Tensor& y) {
      return torch::mse_loss(forward(x), y) + torch::mse_loss(forward(x.flip(0) * 0.5), y);
    });
    Params expected;
    for (const auto& p : plain->named_parameters()) expected[p.key()] = p.value().detach().clone();
    EXPECT_LE(maxDiff(model.fullParameters(), expected), 1e-5);
  }
}

// ddp::activationCheckpoint inside each unit (FSDP2 with torch.utils.checkpoint, the usual pairing):
// the recompute runs in the unit's backward on the gathered parameters, and its gradients leave the
// checkpoint's node for the unit's reduce-scatter. N steps equal the plain units' to the bit, and DDP's.
TEST(FullyShard, ActivationCheckpointedUnitsTrainAsWithout) {
  for (const ddp::FullyShardOptions& options : {ddp::FullyShardOptions{}, zero2()}) {
    SCOPED_TRACE(options.replicateParameters ? "zero2" : "full");
    auto train = [&](bool checkpointed) {
      Sharded model(options);
      if (checkpointed) {
        model.net->runBlock = [&model](size_t i, const torch::Tensor& x) {
          return model.blocks[i].forward([&model, i](const torch::Tensor& h) {
            auto block = model.net->block(i);
            return ddp::activationCheckpoint(*block, [block](const torch::Tensor& t) { return block->forward(t); }, h);
          }, x);
        };
      }
      auto optimizer = sgd()(model.net->parameters());
      for (int s = 0; s < kSteps; ++s) {
        auto [x, y] = batch(s, group().rank());
        optimizer->zero_grad();
        torch::mse_loss(model.forward(x), y).backward();
        optimizer->step();
      }
      return model.fullParameters();
    };
    const Params checkpointed = train(true);
    EXPECT_EQ(maxDiff(checkpointed, train(false)), 0.0);
    EXPECT_LE(maxDiff(checkpointed, trainDdp(sgd())), 1e-5);
  }
}

// The export: fullStateDict gathers DDP's state dict (keys, shapes, values); loading it into a
// fresh sharded model gives each rank its rows back, and a bad dict changes nothing; under ZeRO-2
// too, where the next forward computes with the loaded values.
TEST(FullyShard, FullStateDictIsDdpsAndLoadsBack) {
  for (const ddp::FullyShardOptions& options : {ddp::FullyShardOptions{}, zero2()}) {
    SCOPED_TRACE(options.replicateParameters ? "zero2" : "full");
    Net plain = makeNet();
    Sharded model(options);
    trainSideBySide(plain, model, mseLoss);
    const ddp::StateDict full = ddp::fullStateDict(*model.net);
    const ddp::StateDict expected = ddp::stateDict(*plain);
    ASSERT_EQ(full.size(), expected.size());
    double d = 0;
    for (const auto& [key, t] : expected) {
      ASSERT_EQ(full.count(key), 1u) << key;
      ASSERT_EQ(full.at(key).sizes(), t.sizes()) << key;
      d = std::max(d, (full.at(key) - t).abs().max().item<double>());
    }
    EXPECT_LE(d, 1e-5);

    Sharded fresh(options);
    auto [x0, y0] = batch(0, group().rank());
    torch::mse_loss(fresh.forward(x0), y0).backward();  // ZeRO-2: the initial values stay gathered
    ddp::loadFullStateDict(*fresh.net, full);
    {
      torch::NoGradGuard noGrad;
      EXPECT_TRUE(torch::allclose(fresh.forward(x0), plain->forward(x0), 1e-6, 1e-7)) << "the loaded values compute";
    }
    for (const auto& [key, t] : ddp::fullStateDict(*fresh.net)) EXPECT_TRUE(torch::equal(t, full.at(key))) << key;
    for (const auto& p : fresh.net->named_parameters()) {
      const int64_t c = (full.at(p.key()).size(0) + group().size() - 1) / group().size();
      const int64_t start = std::min(full.at(p.key()).size(0), group().rank() * c);
      EXPECT_TRUE(torch::equal(p.value(), full.at(p.key()).narrow(0, start, p.value().size(0)))) << p.key();
    }
    ddp::StateDict missing = full;
    missing.erase("blocks.1.fc2.bias");
    EXPECT_THROW(ddp::loadFullStateDict(*fresh.net, missing), ddp::ConfigError);
    ddp::StateDict reshaped = full;
    reshaped["head.weight"] = torch::zeros({7, 3});
    EXPECT_THROW(ddp::loadFullStateDict(*fresh.net, reshaped), ddp::ConfigError);
    EXPECT_TRUE(torch::equal(ddp::fullStateDict(*fresh.net).at("head.weight"), full.at("head.weight")));
    // Strict, as set_model_state_dict: a key the model does not have is refused, naming it; a DDP
    // module's keys ("module.") load.
    ddp::StateDict extra = full;
    extra["blocks.9.fc1.weight"] = torch::zeros({2});
    try {
      ddp::loadFullStateDict(*fresh.net, extra);
      ADD_FAILURE() << "a state dict with a key the model does not have loaded";
    } catch (const ddp::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("has 'blocks.9.fc1.weight' that the model does not have"), std::string::npos)
          << e.what();
    }
    ddp::StateDict wrapped;
    for (const auto& [key, t] : full) wrapped["module." + key] = torch::zeros_like(t);
    ddp::loadFullStateDict(*fresh.net, wrapped);
    for (const auto& [key, t] : ddp::fullStateDict(*fresh.net)) EXPECT_EQ(t.abs().max().item<double>(), 0.0) << key;
  }
}

// The export of a sharded model, ddp::saveModel with the group, is the whole model, gathered (it
// wrote rank 0's rows: a file of half-height tensors); without the group it is refused (rank 0
// alone cannot gather), and so is a DDP wrapper over the shards (its broadcast copied rank 0's rows
// over the others'), and the group-less clipping of the rows (each rank's own norm).
TEST(FullyShard, TheExportIsTheWholeModelAndDdpOverShardsIsRefused) {
  const char* port = std::getenv("MASTER_PORT");
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("ddp_fsdp_export_" + std::string(port ? port : "solo") + ".pt")).string();
  for (const ddp::FullyShardOptions& options : {ddp::FullyShardOptions{}, zero2()}) {
    SCOPED_TRACE(options.replicateParameters ? "zero2" : "full");
    Net plain = makeNet();  // the same initial values as the sharded model's
    Sharded model(options);
    ddp::saveModel(*model.net, path, group());
    Net loaded;
    ddp::loadModel(*loaded, path);
    for (const auto& p : plain->named_parameters()) {
      EXPECT_TRUE(torch::equal(loaded->named_parameters()[p.key()], p.value())) << p.key();
    }
    try {
      ddp::saveModel(*model.net, path + ".alone");
      ADD_FAILURE() << "saveModel without the group wrote a sharded model";
    } catch (const ddp::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("call ddp::saveModel(module, path, group) on every rank"), std::string::npos)
          << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(path + ".alone"));
    if (group().size() > 1) {  // each rank's rows: the norm is over every rank's (the group's form)
      EXPECT_THROW(ddp::clipGradNorm(model.net->parameters(), 1.0), ddp::ConfigError);
    }
    try {  // its owners' broadcasts wrote their rows over the other ranks' (wrong weights, silently)
      ddp::ZeroRedundancyOptimizer zero(model.net->parameters(), group(), torch::optim::SGDOptions(0.1));
      ADD_FAILURE() << "ZeroRedundancyOptimizer took a unit's shards";
    } catch (const ddp::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("a fully sharded unit already shards"), std::string::npos) << e.what();
    }
    try {
      ddp::DistributedDataParallel<Net> wrapped(model.net, group());
      ADD_FAILURE() << "DDP wrapped a sharded model";
    } catch (const ddp::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("is a shard of a ddp::fullyShard unit"), std::string::npos) << e.what();
    }
    group().barrier();
  }
  if (group().rank() == 0) std::filesystem::remove(path);
}

// Evaluation (no autograd): the same outputs as the unsharded model, and no backward follows, so
// every unit, the root too, is sharded again after its forward.
TEST(FullyShard, ForwardWithoutGradientReshardsEveryUnit) {
  Net plain = makeNet();
  Sharded model;
  auto [x, y] = batch(0, group().rank());
  torch::NoGradGuard noGrad;
  const torch::Tensor out = model.forward(x);
  EXPECT_TRUE(torch::allclose(out, plain->forward(x), 1e-6, 1e-7));
  EXPECT_TRUE(model.root->isSharded());
  for (const auto& b : model.blocks) EXPECT_TRUE(b.isSharded());
}

// Two micro-batches per step, the first without gradient sync (FSDP2's
// set_requires_gradient_sync(False)), against DDP on both micro-batches in one forward.
TEST(FullyShard, AccumulationWithoutSyncEqualsDdpOnBothMicroBatches) {
  Net plain = makeNet();
  ddp::DistributedDataParallel<Net> ddpModel(plain, group());
  auto ddpOptimizer = adamw()(plain->parameters());
  Sharded model;
  auto optimizer = adamw()(model.net->parameters());
  for (int s = 0; s < 2; ++s) {
    auto [xa, ya] = batch(2 * s, group().rank());
    auto [xb, yb] = batch(2 * s + 1, group().rank());
    ddpOptimizer->zero_grad();
    const torch::Tensor out = ddpModel(torch::cat({xa, xb}));
    (torch::mse_loss(out.narrow(0, 0, kBatch), ya) + torch::mse_loss(out.narrow(0, kBatch, kBatch), yb)).backward();
    ddpOptimizer->step();

    optimizer->zero_grad();
    model.root->setRequiresGradientSync(false);
    torch::mse_loss(model.forward(xa), ya).backward();
    // The sharded .grad is left as zero_grad() left it: undefined (LibTorch 2.x sets it to none),
    // or zeros (LibTorch 1.13's zero_grad() zeroes it in place).
    for (const auto& p : model.net->named_parameters()) {
      const torch::Tensor g = p.value().grad();
      EXPECT_TRUE(!g.defined() || g.abs().sum().item<double>() == 0.0) << p.key() << ": reduced without gradient sync";
    }
    model.root->setRequiresGradientSync(true);
    torch::mse_loss(model.forward(xb), yb).backward();
    optimizer->step();
  }
  Params expected;
  for (const auto& p : plain->named_parameters()) expected[p.key()] = p.value().detach().clone();
  EXPECT_LE(maxDiff(model.fullParameters(), expected), 1e-5);
}

// clip_grad_norm_ over the shards: the global norm (DDP's on the full gradients) and the same
// clipped steps.
TEST(FullyShard, ClippingUsesTheGlobalNorm) {
  Net plain = makeNet();
  ddp::DistributedDataParallel<Net> ddpModel(plain, group());
  auto ddpOptimizer = sgd()(plain->parameters());
  Sharded model;
  auto optimizer = sgd()(model.net->parameters());
  double normDiff = 0, replicatedDiff = 0;
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = batch(s, group().rank());
    ddpOptimizer->zero_grad();
    torch::mse_loss(ddpModel(x), y).backward();
    // The group's overload on DDP's whole gradients (no unit's): each counts once, not per rank.
    const double viaGroup = ddp::clipGradNorm(plain->parameters(), 1e9, group()).item<double>();
    const double expected = ddp::clipGradNorm(plain->parameters(), 0.05).item<double>();
    replicatedDiff = std::max(replicatedDiff, std::abs(viaGroup - expected) / expected);
    ddpOptimizer->step();
    optimizer->zero_grad();
    torch::mse_loss(model.forward(x), y).backward();
    // Every parameter listed twice (as LibTorch's parameters() lists a tied weight): each counts once.
    auto twice = model.net->parameters();
    const auto once = twice;
    twice.insert(twice.end(), once.begin(), once.end());
    const double norm = ddp::clipGradNorm(twice, 0.05, group()).item<double>();
    optimizer->step();
    EXPECT_GT(expected, 0.05) << "the test means to clip";
    normDiff = std::max(normDiff, std::abs(norm - expected) / expected);
  }
  EXPECT_LE(normDiff, 1e-6);
  EXPECT_LE(replicatedDiff, 1e-6);
  Params expected;
  for (const auto& p : plain->named_parameters()) expected[p.key()] = p.value().detach().clone();
  EXPECT_LE(maxDiff(model.fullParameters(), expected), 1e-5);
}

// ddp::FullyShard<Model>: the module and its unit in one; its forward is the module's.
TEST(FullyShard, HolderRunsTheModulesForwardAsTheUnit) {
  torch::manual_seed(9);
  Block plain;
  torch::manual_seed(9);
  ddp::FullyShard<Block> sharded(Block(), group());
  ddp::DistributedDataParallel<Block> ddpModel(plain, group());
  auto [x, y] = batch(0, group().rank());
  const torch::Tensor input = torch::randn({kBatch, 7});
  ddpModel(input).pow(2).mean().backward();
  sharded(input).pow(2).mean().backward();
  EXPECT_TRUE(sharded.unit().isSharded());
  const auto expected = plain->named_parameters();
  for (const auto& p : sharded.module()->named_parameters()) {
    const torch::Tensor g = expected[p.key()].grad();
    const int64_t c = (g.size(0) + group().size() - 1) / group().size();
    const int64_t start = std::min(g.size(0), group().rank() * c);
    EXPECT_TRUE(torch::allclose(p.value().grad(), g.narrow(0, start, p.value().size(0)), 1e-6, 1e-7)) << p.key();
  }
}

TEST(FullyShard, MisuseIsOneLine) {
  Net net = makeNet();
  auto unit = ddp::fullyShard(*net->block(0), group());
  EXPECT_THROW((void)ddp::fullyShard(*net->block(0), group()), ddp::ConfigError);  // twice
  // A parameter of the block's unit registered again under the root: shared by two units.
  net->register_parameter("tied", net->block(0)->fc1->weight);
  try {
    (void)ddp::fullyShard(*net, group());
    ADD_FAILURE() << "a parameter shared by two units was accepted";
  } catch (const ddp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'tied'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fc1.weight"), std::string::npos) << e.what();
  }
  struct Scalar : torch::nn::Module {
    Scalar() { register_parameter("s", torch::ones({})); }
  };
  Scalar scalar;
  EXPECT_THROW((void)ddp::fullyShard(scalar, group()), ddp::ConfigError);
  std::vector<int> all;
  for (int r = 0; r < group().size(); ++r) all.push_back(r);
  ddp::ProcessGroup closed = *group().newGroup(all);
  closed.destroy();
  torch::nn::Linear layer(2, 2);
  EXPECT_THROW((void)ddp::fullyShard(*layer, closed), ddp::ConfigError);
}

// Module::to() after sharding gives the parameters new data, apart from the unit's shards: the
// next forward says so in one line, naming the parameter (PyTorch's FSDP2 fails in its all-gather).
TEST(FullyShard, ModuleToAfterShardingIsOneLine) {
  ddp::FullyShard<Block> sharded(Block(), group());
  sharded.module()->to(at::kDouble);
  try {
    (void)sharded(torch::randn({kBatch, 7}, at::kDouble));
    ADD_FAILURE() << "a forward after Module::to() ran on replaced shards";
  } catch (const ddp::ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("fc1.weight"), std::string::npos) << what;
    EXPECT_NE(what.find("Module::to()"), std::string::npos) << what;
    EXPECT_NE(what.find("Double"), std::string::npos) << what;
  }
  // The same dtype and device: Module::to() keeps the tensors, and the unit trains on.
  ddp::FullyShard<Block> kept(Block(), group());
  kept.module()->to(at::kFloat);
  kept(torch::randn({kBatch, 7})).pow(2).mean().backward();
  EXPECT_TRUE(kept.unit().isSharded());
}

}  // namespace
}  // namespace fsdp_test
