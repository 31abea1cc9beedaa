// Checkpoints, the GradScaler across ranks and the export through the public library (see
// api_ranks_test.cc); linked last: its last test destroys the group.
#include "tests/libddp/api_ranks_support.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/run_command.h"

namespace api_ranks {
namespace {

// Three steps of `optimizer` on fixed data; a checkpoint after step 2, resumed into a fresh model and
// optimizer, must give the same step 3 to the bit (momentum / Adam moments restored).
template <typename MakeOptimizer>
void checkExactResume(const std::string& name, MakeOptimizer makeOptimizer) {
  const std::string dir = scratchDir(name);
  if (group().rank() == 0) std::filesystem::remove_all(dir);
  group().barrier();
  torch::manual_seed(4);
  const auto x = torch::randn({6, 5}), y = torch::randn({6, 3});
  auto step = [&](ddp::DistributedDataParallel<Net>& model, torch::optim::Optimizer& opt) {
    opt.zero_grad();
    torch::mse_loss(model(x), y).backward();
    opt.step();
  };
  Net net;
  ddp::DistributedDataParallel<Net> model(net, group());
  auto optimizer = makeOptimizer(*net);
  ddp::Checkpointer checkpointer(group(), {dir});
  step(model, *optimizer);
  step(model, *optimizer);
  // As a loop with 3 micro-batches a step records it (6 batches of 2 samples).
  const std::string path = checkpointer.save(*net, *optimizer, {0, 2, 2, 12, 12, 6});
  step(model, *optimizer);
  const auto expected = flatParams(*net);

  torch::manual_seed(99);
  Net fresh;
  ddp::DistributedDataParallel<Net> freshModel(fresh, group());
  auto freshOptimizer = makeOptimizer(*fresh);
  ddp::Checkpointer again(group(), {dir});
  const auto position = again.resume(*fresh, *freshOptimizer);
  ASSERT_TRUE(position.has_value());
  EXPECT_EQ(position->globalStep, 2);
  EXPECT_EQ(position->stepInEpoch, 2);
  EXPECT_EQ(position->samples, 12);
  EXPECT_EQ(position->epochSamples, 12);
  EXPECT_EQ(position->microSteps, 6);
  step(freshModel, *freshOptimizer);
  EXPECT_TRUE(torch::equal(flatParams(*fresh), expected));
  EXPECT_TRUE(std::filesystem::exists(path));
  group().barrier();
  if (group().rank() == 0) std::filesystem::remove_all(dir);
}

TEST(Checkpointer, SgdWithMomentumResumesExactly) {
  checkExactResume("sgd", [](NetImpl& net) {
    return std::make_unique<torch::optim::SGD>(net.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  });
}

TEST(Checkpointer, AdamResumesExactly) {
  checkExactResume("adam", [](NetImpl& net) {
    return std::make_unique<torch::optim::Adam>(net.parameters(), torch::optim::AdamOptions(0.01));
  });
}

// A checkpoint of AdamW over the whole model resumed into AdamW (or SGD with momentum) over fc2
// alone: torch's load_state_dict refuses ("loaded state dict contains a parameter group that
// doesn't match the size of optimizer's group"); fc1's state would have been dropped silently.
TEST(Checkpointer, StateOfAParameterTheOptimizerDoesNotHoldIsRefused) {
  for (const bool sgd : {false, true}) {
    const std::string dir = scratchDir(sgd ? "subset_sgd" : "subset_adamw");
    if (group().rank() == 0) std::filesystem::remove_all(dir);
    group().barrier();
    Net net;
    ddp::DistributedDataParallel<Net> model(net, group());
    std::unique_ptr<torch::optim::Optimizer> whole;
    if (sgd) whole = std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    else whole = std::make_unique<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(0.01));
    torch::mse_loss(model(torch::randn({6, 5})), torch::randn({6, 3})).backward();
    whole->step();
    ddp::Checkpointer(group(), {dir}).save(*net, *whole, {0, 1, 1, 6});
    Net fresh;
    std::unique_ptr<torch::optim::Optimizer> head;
    if (sgd) head = std::make_unique<torch::optim::SGD>(fresh->fc2->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    else head = std::make_unique<torch::optim::AdamW>(fresh->fc2->parameters(), torch::optim::AdamWOptions(0.01));
    try {
      ddp::Checkpointer(group(), {dir}).resume(*fresh, *head);
      ADD_FAILURE() << "resumed the whole model's optimizer state into one over fc2 alone";
    } catch (const ddp::CheckpointError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("has optimizer state for 'fc1."), std::string::npos) << what;  // weight or bias
      EXPECT_NE(what.find("', a parameter this optimizer does not hold (it holds 2 of the model's 4 parameters)"),
                std::string::npos)
          << what;
    }
    group().barrier();
    if (group().rank() == 0) std::filesystem::remove_all(dir);
  }
}

// FusedAdamW's state (float step tensors, moments) travels under Adam's names too.
TEST(Checkpointer, FusedAdamWResumesExactly) {
  if (!ddp::FusedAdamW::available(torch::kCPU)) {
    Net net;
    EXPECT_THROW(ddp::FusedAdamW(net->parameters()), ddp::ConfigError);  // LibTorch 1.13: no fused kernel
    return;
  }
  checkExactResume("fused_adamw", [](NetImpl& net) {
    ddp::FusedAdamWOptions o;
    o.lr = 0.01;
    o.weightDecay = 0.1;
    return std::make_unique<ddp::FusedAdamW>(net.parameters(), o);
  });
}

// FusedSGD is a LibTorch SGD to checkpoints: its momentum buffers come back, step 3 is the same.
TEST(Checkpointer, FusedSgdResumesExactly) {
  if (!ddp::FusedSGD::available(torch::kCPU)) {
    Net net;
    EXPECT_THROW(ddp::FusedSGD(net->parameters(), torch::optim::SGDOptions(0.1)), ddp::ConfigError);
    return;
  }
  checkExactResume("fused_sgd", [](NetImpl& net) {
    return std::make_unique<ddp::FusedSGD>(net.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  });
}

// AdamW under an fp16 GradScaler: the moments (by parameter name) and the scaler's scale and growth
// tracker come back from the checkpoint, so step 3 is the same to the bit.
TEST(Checkpointer, AdamWWithGradScalerResumesExactly) {
  const std::string dir = scratchDir("adamw_scaler");
  if (group().rank() == 0) std::filesystem::remove_all(dir);
  group().barrier();
  torch::manual_seed(6);
  const auto x = torch::randn({6, 5}), y = torch::randn({6, 3});
  const ddp::GradScalerOptions options{1024.0, 2.0, 0.5, /*growthInterval=*/2};
  auto step = [&](ddp::DistributedDataParallel<Net>& model, torch::optim::Optimizer& opt, ddp::GradScaler& scaler) {
    opt.zero_grad();
    scaler.scale(torch::mse_loss(model(x), y)).backward();
    scaler.step(opt);
    scaler.update();
  };
  auto makeAdamW = [](NetImpl& net) {
    return std::make_unique<torch::optim::AdamW>(net.parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  };
  Net net;
  ddp::DistributedDataParallel<Net> model(net, group());
  auto optimizer = makeAdamW(*net);
  ddp::GradScaler scaler(group(), options);
  ddp::Checkpointer checkpointer(group(), {dir});
  step(model, *optimizer, scaler);
  step(model, *optimizer, scaler);  // the second finite step: the scale grows to 2048
  step(model, *optimizer, scaler);
  const std::string path = checkpointer.save(*net, *optimizer, {0, 3, 3, 18}, &scaler);
  EXPECT_EQ(scaler.getScale(), 2048.0);
  EXPECT_EQ(scaler.stateDict()->growthTracker, 1);
  step(model, *optimizer, scaler);
  const auto expected = flatParams(*net);
  EXPECT_EQ(scaler.getScale(), 4096.0);

  torch::manual_seed(99);
  Net fresh;
  ddp::DistributedDataParallel<Net> freshModel(fresh, group());
  auto freshOptimizer = makeAdamW(*fresh);
  ddp::GradScaler freshScaler(group(), options);
  ddp::Checkpointer again(group(), {dir});
  ASSERT_TRUE(again.resume(*fresh, *freshOptimizer, &freshScaler).has_value());
  EXPECT_EQ(freshScaler.getScale(), 2048.0);
  step(freshModel, *freshOptimizer, freshScaler);
  EXPECT_TRUE(torch::equal(flatParams(*fresh), expected));
  EXPECT_EQ(freshScaler.getScale(), 4096.0);
  // An SGD cannot take Adam's state: one CheckpointError, nothing changed.
  torch::optim::SGD sgd(fresh->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  EXPECT_THROW(again.resumeFrom(path, *fresh, sgd), ddp::CheckpointError);
  group().barrier();
  if (group().rank() == 0) std::filesystem::remove_all(dir);
}

// The found-inf flag is agreed on over the group: a gradient that overflows on one rank only
// (gradients outside DDP, so nothing averages them) makes every rank skip the step and back off.
TEST(GradScaler, EveryRankSkipsTheStepOneRankOverflowed) {
  auto p = torch::ones({4}, torch::requires_grad());
  torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.5));
  ddp::GradScaler scaler(group(), {256.0});
  const bool lastRank = group().rank() == group().size() - 1;
  for (int i = 0; i < 2; ++i) {
    sgd.zero_grad();
    auto g = torch::full({4}, 1.0);
    if (i == 0 && lastRank) g[1] = INFINITY;
    scaler.scale((p * g).sum()).backward();
    scaler.step(sgd);
    scaler.update();
    const bool stepped = scaler.foundInf().item<float>() == 0.0f;
    EXPECT_EQ(stepped, i == 1) << "iteration " << i;
    EXPECT_EQ(scaler.getScale(), 128.0) << "iteration " << i;  // backed off once, then one finite step
  }
  EXPECT_TRUE(torch::equal(p.detach(), torch::full({4}, 0.5)));  // only the second step: 1 - 0.5 · 1
  EXPECT_TRUE(equalOnAllRanks(p));
}

TEST(Checkpointer, NothingToResumeIsNullopt) {
  const std::string dir = scratchDir("empty");
  Net net;
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  ddp::Checkpointer checkpointer(group(), {dir});
  EXPECT_FALSE(checkpointer.resume(*net, optimizer).has_value());
  ddp::CheckpointOptions bad;
  bad.keepLast = -1;
  EXPECT_THROW(ddp::Checkpointer(group(), bad), ddp::ConfigError);
}

// The checkpoint files in `dir`, by name.
std::vector<std::string> checkpointNames(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& path : ddp::listCheckpoints(dir)) names.push_back(std::filesystem::path(path).filename().string());
  return names;
}

// keepLast counts and deletes only this run's checkpoints: a fresh run's own saves were pruned by
// another run's higher steps (ckpt-1 ranked below ckpt-200) or pruned theirs. "This run" is this
// process, whichever Checkpointer saved (one made for each save kept them all). After a resume, the
// checkpoint resumed from and the older ones are this run's. Another run's checkpoints: copies,
// into this directory, of files this process wrote elsewhere.
TEST(Checkpointer, KeepLastCountsOnlyThisRunsCheckpoints) {
  const std::string dir = scratchDir("keep_own"), elsewhere = scratchDir("keep_other");
  if (group().rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::remove_all(elsewhere);
  }
  group().barrier();
  Net net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  ddp::CheckpointOptions options;
  options.keepLast = 2;
  options.dir = elsewhere;
  {
    ddp::Checkpointer earlier(group(), options);
    for (int64_t step : {100, 200}) earlier.save(*net, sgd, {0, step, step, step});
  }
  if (group().rank() == 0) {
    std::filesystem::create_directories(dir);
    for (const char* name : {"ckpt-00000100.pt", "ckpt-00000200.pt"}) {
      std::filesystem::copy_file(elsewhere + "/" + name, dir + "/" + name);
    }
  }
  group().barrier();
  options.dir = dir;
  for (int64_t step : {1, 2, 3}) ddp::Checkpointer(group(), options).save(*net, sgd, {0, step, step, step});
  group().barrier();
  const std::vector<std::string> kept = {"ckpt-00000002.pt", "ckpt-00000003.pt", "ckpt-00000100.pt", "ckpt-00000200.pt"};
  EXPECT_EQ(checkpointNames(dir), kept);

  ddp::Checkpointer resumed(group(), options);
  const auto position = resumed.resume(*net, sgd);
  ASSERT_TRUE(position.has_value());
  EXPECT_EQ(position->globalStep, 200);
  resumed.save(*net, sgd, {0, 201, 201, 201});
  group().barrier();
  EXPECT_EQ(checkpointNames(dir), (std::vector<std::string>{"ckpt-00000200.pt", "ckpt-00000201.pt"}));
  group().barrier();
  if (group().rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::remove_all(elsewhere);
  }
}

// Ranks seeded apart (dropout, augmentation) draw apart; a resume gives each its own CPU generator
// back (every rank drew rank 0's numbers after it), so steps 3 and 4 draw what they drew before.
// Every rank must save the same position: another rank's step is a ConfigError on every rank.
TEST(Checkpointer, EachRankResumesItsOwnCpuGeneratorAndAllSaveOneStep) {
  const std::string dir = scratchDir("rng");
  if (group().rank() == 0) std::filesystem::remove_all(dir);
  group().barrier();
  Net net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  torch::manual_seed(100 + group().rank());
  ddp::Checkpointer checkpointer(group(), {dir});
  std::vector<double> straight;
  for (int64_t step = 1; step <= 4; ++step) {
    straight.push_back(torch::rand({1}).item<double>());
    if (step == 2) checkpointer.save(*net, sgd, {0, step, step, step});
  }
  torch::manual_seed(7);  // anything: the resume sets it
  ddp::Checkpointer again(group(), {dir});
  const ddp::TrainPosition resumed = again.resume(*net, sgd).value_or(ddp::TrainPosition{});
  ASSERT_EQ(resumed.globalStep, 2);
  EXPECT_EQ(resumed.microSteps, -1);  // saved without one: not recorded, not 0
  for (size_t i = 2; i < 4; ++i) EXPECT_EQ(torch::rand({1}).item<double>(), straight[i]) << "step " << i + 1;
  if (group().size() > 1) {
    try {
      again.save(*net, sgd, {0, 10 + group().rank(), 10 + group().rank(), 10});
      ADD_FAILURE() << "saved with a different step on each rank";
    } catch (const ddp::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("the ranks save different positions (rank " + std::to_string(group().rank()) +
                                           " has globalStep " + std::to_string(10 + group().rank()) + ")"),
                std::string::npos)
          << e.what();
    }
  }
  group().barrier();
  if (group().rank() == 0) std::filesystem::remove_all(dir);
}

// Resume takes the highest step: a save below one of this run's checkpoints in the directory (written
// by this process through any Checkpointer, or resumed from there) would never be resumed from, and
// is refused on every rank before anything is written. A checkpoint resumed from elsewhere (a run to
// fine-tune from) does not count, nor does a checkpoint no longer there.
TEST(Checkpointer, ASaveBelowTheLastStepIsRefused) {
  const std::string dir = scratchDir("lower"), other = scratchDir("lower_other");
  if (group().rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::remove_all(other);
  }
  group().barrier();
  Net net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  ddp::Checkpointer checkpointer(group(), {dir});
  checkpointer.save(*net, sgd, {0, 5, 5, 5});
  try {
    checkpointer.save(*net, sgd, {0, 3, 3, 3});
    ADD_FAILURE() << "saved step 3 after step 5";
  } catch (const ddp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("step 3 after step 5"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ddp::Checkpointer(group(), {dir}).save(*net, sgd, {0, 2, 2, 2}), ddp::ConfigError);  // one per save
  ddp::Checkpointer resumed(group(), {dir});
  ASSERT_EQ(resumed.resume(*net, sgd).value_or(ddp::TrainPosition{}).globalStep, 5);
  EXPECT_THROW(resumed.save(*net, sgd, {0, 4, 4, 4}), ddp::ConfigError);
  ddp::Checkpointer fineTune(group(), {other});
  (void)fineTune.resumeFrom(dir + "/ckpt-00000005.pt", *net, sgd);
  EXPECT_EQ(std::filesystem::path(fineTune.save(*net, sgd, {0, 1, 1, 1})).filename(), "ckpt-00000001.pt");
  group().barrier();
  EXPECT_EQ(checkpointNames(dir), std::vector<std::string>{"ckpt-00000005.pt"});
  EXPECT_EQ(checkpointNames(other), std::vector<std::string>{"ckpt-00000001.pt"});
  group().barrier();
  if (group().rank() == 0) std::filesystem::remove_all(dir);
  group().barrier();
  EXPECT_EQ(std::filesystem::path(ddp::Checkpointer(group(), {dir}).save(*net, sgd, {0, 1, 1, 1})).filename(),
            "ckpt-00000001.pt");
  group().barrier();
  if (group().rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::remove_all(other);
  }
}

// A save at the step of the last one writes nothing (a stop's save right after a periodic one) when
// the position is the same; at another position it is a loop that does not count its steps (the
// docs' loop once saved {epoch + 1, 0, 0} every epoch: one checkpoint, the first epoch's, for ever).
TEST(Checkpointer, ASaveAtTheSameStepButAnotherPositionIsRefused) {
  const std::string dir = scratchDir("same_step");
  if (group().rank() == 0) std::filesystem::remove_all(dir);
  group().barrier();
  Net net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  ddp::Checkpointer checkpointer(group(), {dir});
  const std::string first = checkpointer.save(*net, sgd, {1, 0, 0, 0, 0});
  {
    torch::NoGradGuard noGrad;
    for (auto& p : net->parameters()) p.add_(1.0);
  }
  EXPECT_EQ(checkpointer.save(*net, sgd, {1, 0, 0, 0, 0}), first);  // the same position: nothing to write
  try {
    checkpointer.save(*net, sgd, {2, 0, 0, 0, 0});
    ADD_FAILURE() << "a second epoch's save at global step 0 was dropped silently";
  } catch (const ddp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("global step 0, at the end of the 1st epoch is saved already, and this save "
                                         "is at global step 0 again but at another position (global step 0, at the "
                                         "end of the 2nd epoch"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("count TrainPosition::globalStep up with every optimizer step"),
              std::string::npos)
        << e.what();
  }
  group().barrier();
  EXPECT_EQ(checkpointNames(dir), std::vector<std::string>{"ckpt-00000000.pt"});
  group().barrier();
  if (group().rank() == 0) std::filesystem::remove_all(dir);
}

// A directory another job holds (its lock file, here held by flock(1) and naming pid 4242): every
// rank's save is refused before anything is written; once the other job is gone, the save goes.
TEST(Checkpointer, ADirectoryAnotherJobHoldsIsRefused) {
  const std::string dir = scratchDir("held");
  const std::string lock = dir + "/.ddp-launch.lock";
  std::unique_ptr<ddp::test::Background> other;
  if (group().rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::ofstream(lock) << "4242\nanother host 1\n";
    other = std::make_unique<ddp::test::Background>(
        std::vector<std::string>{"/usr/bin/flock", lock, "/bin/sh", "-c", "echo locked; exec tail -f /dev/null"}, dir + ".log");
    ASSERT_TRUE(other->waitFor("locked", 30)) << ddp::test::readFile(other->log);
  }
  group().barrier();
  Net net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  ddp::Checkpointer checkpointer(group(), {dir});
  try {
    checkpointer.save(*net, sgd, {0, 1, 1, 1});
    ADD_FAILURE() << "saved into a directory another job holds";
  } catch (const ddp::CheckpointError& e) {
    const std::string what = e.what();
    const std::string expected = group().rank() == 0
        ? "checkpoint: " + dir + " is in use by another job (pid 4242 holds " + lock + "); give each job its own "
          "ddp::CheckpointOptions::dir"
        : "checkpoint: rank 0 could not take " + dir + " for this job";
    EXPECT_NE(what.find(expected), std::string::npos) << what;
  }
  EXPECT_TRUE(checkpointNames(dir).empty());
  group().barrier();
  if (group().rank() == 0) {
    ::kill(-other->pid, SIGKILL);
    EXPECT_EQ(other->wait(30), 128 + SIGKILL);
    // The lock goes with the holder's last process (tail, which the shell under flock became), which
    // may still be dying when flock itself has been reaped: wait until the lock can be taken.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    bool free = false;
    while (!free && std::chrono::steady_clock::now() < deadline) {
      const int fd = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC);
      free = fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0;
      if (fd >= 0) ::close(fd);
      if (!free) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polls the lock itself
    }
    EXPECT_TRUE(free) << lock << " still locked 30 s after its holder was killed";
  }
  group().barrier();
  EXPECT_EQ(std::filesystem::path(checkpointer.save(*net, sgd, {0, 1, 1, 1})).filename(), "ckpt-00000001.pt");
  group().barrier();
  if (group().rank() == 0) std::filesystem::remove_all(dir);
  if (group().rank() == 0) std::filesystem::remove(dir + ".log");
}

TEST(Export, RankZeroWritesPlainKeysThatLoadBack) {
  const std::string dir = scratchDir("export");
  if (group().rank() == 0) std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  torch::manual_seed(6);
  Net net;
  ddp::DistributedDataParallel<Net> model(net, group());
  ddp::saveModel(*net, dir + "/model.pt", group());
  Net loaded;
  ddp::loadModel(*loaded, dir + "/model.pt");
  EXPECT_TRUE(torch::equal(flatParams(*loaded), flatParams(*net)));
  torch::nn::Linear other(2, 2);
  EXPECT_THROW(ddp::loadModel(*other, dir + "/model.pt"), ddp::CheckpointError);
  group().barrier();
  if (group().rank() == 0) std::filesystem::remove_all(dir);
}

TEST(Shutdown, DestroyIsCollectiveAndFinal) {
  // Last: the group is gone afterwards.
  group().destroy();
  EXPECT_TRUE(group().destroyed());
  group().destroy();  // idempotent
  EXPECT_EQ(group().size(), std::getenv("WORLD_SIZE") ? std::atoi(std::getenv("WORLD_SIZE")) : 1);  // still answers
  auto t = torch::ones({1});
  EXPECT_THROW(group().allReduce(t), ddp::ConfigError);
}

}  // namespace
}  // namespace api_ranks
