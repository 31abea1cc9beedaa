// The env contract as the worker reads it: torchrun, Slurm, Open MPI, legacy --local_rank.
#include <gtest/gtest.h>

#include <map>

#include "common/error.h"
#include "worker/env.h"

namespace ddp::worker {
namespace {

EnvLookup fakeEnv(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(Env, NoVariablesMeansOneRankOnLoopback) {
  const DistEnv e = readDistEnv(fakeEnv({}));
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.worldSize, 1);
  EXPECT_EQ(e.masterAddr, "127.0.0.1");
}

TEST(Env, TorchrunContract) {
  const DistEnv e = readDistEnv(fakeEnv({{"RANK", "5"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "8"},
                                         {"LOCAL_WORLD_SIZE", "4"}, {"GROUP_RANK", "1"},
                                         {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "2222"}}));
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.localRank, 1);
  EXPECT_EQ(e.worldSize, 8);
  EXPECT_EQ(e.localWorldSize, 4);
  EXPECT_EQ(e.groupRank, 1);
  EXPECT_EQ(e.masterAddr, "10.1.2.3");
  EXPECT_EQ(e.masterPort, 2222);
  EXPECT_EQ(e.source, "torchrun");
}

TEST(Env, SlurmAndOpenMpiWhenRankIsAbsent) {
  const DistEnv s = readDistEnv(fakeEnv({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "2"}}));
  EXPECT_EQ(s.source, "slurm");
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.worldSize, 4);
  EXPECT_EQ(s.localRank, 1);
  const DistEnv m = readDistEnv(fakeEnv({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"},
                                         {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}}));
  EXPECT_EQ(m.source, "openmpi");
  EXPECT_EQ(m.rank, 2);
  EXPECT_EQ(m.worldSize, 3);
  EXPECT_EQ(m.localRank, 2);
}

TEST(Env, MalformedOrInconsistentValuesNameTheVariable) {
  auto message = [](std::map<std::string, std::string> vars) {
    try {
      readDistEnv(fakeEnv(std::move(vars)));
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_NE(message({{"RANK", "x"}}).find("RANK='x'"), std::string::npos);
  EXPECT_NE(message({{"RANK", "4"}, {"WORLD_SIZE", "4"}}).find("not below the world size 4"), std::string::npos);
  EXPECT_NE(message({{"MASTER_PORT", "70000"}}).find("MASTER_PORT"), std::string::npos);
}

TEST(Env, LegacyLocalRankArgumentIsTakenOut) {
  std::vector<std::string> args{"--local_rank=2", "cfg.yaml", "train.lr=1"};
  EXPECT_EQ(takeLegacyLocalRank(args), 2);
  EXPECT_EQ(args, (std::vector<std::string>{"cfg.yaml", "train.lr=1"}));
  std::vector<std::string> spaced{"cfg.yaml", "--local-rank", "1"};
  EXPECT_EQ(takeLegacyLocalRank(spaced), 1);
  EXPECT_EQ(spaced, (std::vector<std::string>{"cfg.yaml"}));
  std::vector<std::string> none{"cfg.yaml"};
  EXPECT_FALSE(takeLegacyLocalRank(none).has_value());
  const DistEnv e = readDistEnv(fakeEnv({{"RANK", "1"}, {"WORLD_SIZE", "2"}}), 1);
  EXPECT_EQ(e.localRank, 1);
}

}  // namespace
}  // namespace ddp::worker
