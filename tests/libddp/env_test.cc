// The env contract as the worker reads it: torchrun, Slurm, Open MPI, legacy --local_rank.
#include <gtest/gtest.h>

#include <map>

#include "common/error.h"
#include "libddp/runtime/env.h"

namespace ddp::runtime {
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
  const DistEnv s = readDistEnv(fakeEnv({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"},
                                         {"SLURM_NTASKS_PER_NODE", "2"}, {"SLURM_STEP_ID", "0"}}));
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

// Slurm's per-node layout, as srun sets it for a step (sbatch/srun man pages, OUTPUT ENVIRONMENT):
// SLURM_STEP_TASKS_PER_NODE "2(x3),1" means nodes 0-2 run 2 tasks each and node 3 runs 1;
// SLURM_NODEID is this node's index in the step.
DistEnv slurmTask(int procid, int nodeid, int localid, const std::string& perNode, int ntasks) {
  return readDistEnv(fakeEnv({{"SLURM_PROCID", std::to_string(procid)}, {"SLURM_NTASKS", std::to_string(ntasks)},
                              {"SLURM_STEP_NUM_TASKS", std::to_string(ntasks)}, {"SLURM_NODEID", std::to_string(nodeid)},
                              {"SLURM_LOCALID", std::to_string(localid)}, {"SLURM_STEP_TASKS_PER_NODE", perNode}}));
}

TEST(Env, SlurmTasksPerNodeComeFromTheStepLayoutNotTheJobSize) {
  // Plain `srun -N2 -n4` (no --ntasks-per-node, so no SLURM_NTASKS_PER_NODE): 2 ranks per host,
  // not 4 — the worker must not believe every rank shares one host (shm, loopback).
  const DistEnv even = slurmTask(3, 1, 1, "2(x2)", 4);
  EXPECT_EQ(even.worldSize, 4);
  EXPECT_EQ(even.localWorldSize, 2);
  EXPECT_EQ(even.localRank, 1);
  EXPECT_EQ(even.groupRank, 1);
  // Uneven: `srun -N4 -n7` lays out 2,2,2,1.
  EXPECT_EQ(slurmTask(0, 0, 0, "2(x3),1", 7).localWorldSize, 2);
  EXPECT_EQ(slurmTask(5, 2, 1, "2(x3),1", 7).localWorldSize, 2);
  EXPECT_EQ(slurmTask(6, 3, 0, "2(x3),1", 7).localWorldSize, 1);
  EXPECT_EQ(slurmTask(3, 1, 0, "3,1", 4).localWorldSize, 1);
  // The allocation's SLURM_TASKS_PER_NODE when the step's is absent; SLURM_NTASKS_PER_NODE last.
  EXPECT_EQ(readDistEnv(fakeEnv({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "3"}, {"SLURM_NODEID", "1"},
                                 {"SLURM_TASKS_PER_NODE", "2,1"}, {"SLURM_STEP_ID", "0"}}))
                .localWorldSize,
            1);
  EXPECT_EQ(readDistEnv(fakeEnv({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_NTASKS_PER_NODE", "2"},
                                 {"SLURM_STEP_ID", "0"}}))
                .localWorldSize,
            2);
  // One node, nothing per node: the whole step is local.
  EXPECT_EQ(readDistEnv(fakeEnv({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}})).localWorldSize, 2);
}

TEST(Env, MalformedSlurmLayoutsNameTheVariable) {
  for (const std::string bad : {"2(x", "2(x0)", "x,1", "2(y3)", "2,,1"}) {
    try {
      slurmTask(0, 0, 0, bad, 2);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("SLURM_STEP_TASKS_PER_NODE"), std::string::npos) << e.what();
    }
  }
  try {
    slurmTask(0, 5, 0, "2(x2)", 4);
    ADD_FAILURE() << "accepted a node id past the layout";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_NODEID=5"), std::string::npos) << e.what();
  }
}

// Where rank 0 listens when srun or mpirun started the ranks and MASTER_ADDR/MASTER_PORT are not
// exported: node 0 of the step (first host of SLURM_STEP_NODELIST), a port from the job id
// (20000 + id % 10000, common/cluster_env.h), the same on every rank.
TEST(Env, SrunWorkersFindRankZerosHostAndPortInTheStep) {
  std::map<std::string, std::string> vars{{"SLURM_PROCID", "3"},         {"SLURM_NTASKS", "4"},
                                          {"SLURM_STEP_NUM_TASKS", "4"},  {"SLURM_NODEID", "1"},
                                          {"SLURM_LOCALID", "1"},         {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
                                          {"SLURM_STEP_NUM_NODES", "2"},  {"SLURM_STEP_NODELIST", "gpu[07-08]"},
                                          {"SLURM_JOB_NODELIST", "gpu[03,07-08]"}, {"SLURM_JOB_ID", "123456"}};
  const DistEnv e = readDistEnv(fakeEnv(vars));
  EXPECT_EQ(e.masterAddr, "gpu07");
  EXPECT_EQ(e.masterPort, 23456);
  // What the user exports wins.
  vars["MASTER_ADDR"] = "10.0.0.9";
  vars["MASTER_PORT"] = "29411";
  const DistEnv exported = readDistEnv(fakeEnv(vars));
  EXPECT_EQ(exported.masterAddr, "10.0.0.9");
  EXPECT_EQ(exported.masterPort, 29411);
  // One node: loopback, still the job's port (two jobs on one node do not collide).
  std::map<std::string, std::string> oneNode{{"SLURM_PROCID", "1"},          {"SLURM_NTASKS", "2"},
                                             {"SLURM_STEP_NUM_NODES", "1"},  {"SLURM_STEP_NODELIST", "gpu07"},
                                             {"SLURM_STEP_TASKS_PER_NODE", "2"}, {"SLURM_JOB_ID", "77"}};
  const DistEnv one = readDistEnv(fakeEnv(oneNode));
  EXPECT_EQ(one.masterAddr, "127.0.0.1");
  EXPECT_EQ(one.masterPort, 20077);
  EXPECT_EQ(one.worldSize, 2);
  // The job's second step running beside the first: a port of its own.
  oneNode["SLURM_STEP_ID"] = "1";
  EXPECT_EQ(readDistEnv(fakeEnv(oneNode)).masterPort, 20000 + (77 + 1009) % 10000);
}

// A worker run directly in an sbatch script (no srun): the batch shell has SLURM_PROCID=0 and the
// job's SLURM_NTASKS=2 but is no task of a step; it is a job of one process, as a launcher there is
// (as rank 0 of 2 it waited comm.timeout_s for a rank that never came).
TEST(Env, TheBatchScriptOfAnSbatchJobIsNoStep) {
  std::map<std::string, std::string> batch{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "77"},
                                           {"SLURM_TASKS_PER_NODE", "2"}, {"SLURM_NNODES", "1"}};
  const DistEnv alone = readDistEnv(fakeEnv(batch));
  EXPECT_EQ(alone.worldSize, 1);
  EXPECT_EQ(alone.rank, 0);
  EXPECT_NE(alone.source, "slurm");
  batch["SLURM_STEP_TASKS_PER_NODE"] = "2";  // even where the batch step carries a step's variables
  // The batch, extern and interactive steps' ids over Slurm's versions (20.11 renumbered them).
  for (const char* special : {"4294967294", "4294967291", "4294967292", "4294967290", "batch", "interactive"}) {
    batch["SLURM_STEP_ID"] = special;
    EXPECT_EQ(readDistEnv(fakeEnv(batch)).worldSize, 1) << special;
  }
  batch["SLURM_STEP_ID"] = "0";
  EXPECT_EQ(readDistEnv(fakeEnv(batch)).worldSize, 2);  // an srun step's task
}

TEST(Env, MpirunWorkers) {
  // Open MPI 4.1's variables for rank 1 of `mpirun -np 2` on one host.
  std::map<std::string, std::string> vars{{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                          {"OMPI_COMM_WORLD_NODE_RANK", "1"}, {"OMPI_MCA_orte_num_nodes", "1"},
                                          {"OMPI_MCA_ess_base_jobid", "1989214209"}};
  const DistEnv one = readDistEnv(fakeEnv(vars));
  EXPECT_EQ(one.source, "openmpi");
  EXPECT_EQ(one.masterAddr, "127.0.0.1");
  EXPECT_EQ(one.masterPort, 24209);
  // mpirun inside a Slurm allocation starts its daemons with srun: its ranks also carry the
  // daemon's SLURM_PROCID, which is not their rank.
  vars["SLURM_PROCID"] = "0";
  vars["SLURM_NTASKS"] = "1";
  EXPECT_EQ(readDistEnv(fakeEnv(vars)).rank, 1);
  EXPECT_EQ(readDistEnv(fakeEnv(vars)).source, "openmpi");
  // Several hosts: Open MPI does not say where rank 0 runs, so MASTER_ADDR must be exported.
  vars["OMPI_MCA_orte_num_nodes"] = "2";
  vars["OMPI_COMM_WORLD_SIZE"] = "4";
  try {
    readDistEnv(fakeEnv(vars));
    ADD_FAILURE() << "a multi-host mpirun job without MASTER_ADDR was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("mpirun -x MASTER_ADDR -x MASTER_PORT"), std::string::npos) << e.what();
  }
  vars["MASTER_ADDR"] = "node1";
  EXPECT_EQ(readDistEnv(fakeEnv(vars)).masterAddr, "node1");
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
  // torchrun's WORLD_SIZE without its RANK: not a world of one that trains alone.
  EXPECT_NE(message({{"WORLD_SIZE", "2"}}).find("WORLD_SIZE=2 but RANK is not set"), std::string::npos);
  EXPECT_NE(message({{"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}}).find("export RANK=0..3 per process"), std::string::npos);
  EXPECT_EQ(readDistEnv(fakeEnv({{"WORLD_SIZE", "1"}})).worldSize, 1);  // a world of one needs no RANK
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
}  // namespace ddp::runtime
