// ddp-launch under srun (issue 14, item 5): `sbatch -n 2` + `srun ddp-launch --nproc_per_node=2`
// ran the job twice. The environments below are the ones srun gives its tasks (Slurm 22.05).
#include "launcher/slurm_step.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace ddp::launcher {
namespace {

EnvMap srunTask(int procId, int nodeId, const std::string& tasksPerNode, int tasks) {
  return {{"SLURM_JOB_ID", "17"},        {"SLURM_STEP_ID", "0"},
          {"SLURM_PROCID", std::to_string(procId)}, {"SLURM_NODEID", std::to_string(nodeId)},
          {"SLURM_STEP_TASKS_PER_NODE", tasksPerNode}, {"SLURM_STEP_NUM_TASKS", std::to_string(tasks)}};
}

std::string errorOf(const LaunchOptions& options, const EnvMap& env) {
  try {
    checkSrunLayout(options, env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(SrunLayout, TwoLaunchersOnOneNodeAreRefused) {
  LaunchOptions options;
  options.nprocPerNode = 2;
  const std::string error = errorOf(options, srunTask(1, 0, "2", 2));
  EXPECT_NE(error.find("one of 2 srun tasks on this node (SLURM_STEP_TASKS_PER_NODE=2)"), std::string::npos) << error;
  // With -n: in an allocation of more tasks srun keeps SLURM_NTASKS and ignores --ntasks-per-node=1
  // alone (a Slurm review: the advice failed in the very case it names).
  EXPECT_NE(error.find("srun -n 1 --ntasks-per-node=1 ddp-launch"), std::string::npos) << error;
  // Uneven layouts: node 1 of "1,2(x2)" runs two.
  EXPECT_NE(errorOf(options, srunTask(2, 1, "1,2(x2)", 5)).find("one of 2 srun tasks"), std::string::npos);
  // ... and node 0, with one task, refuses as well, naming the layout (it said "runs on 5 nodes").
  const std::string single = errorOf(options, srunTask(0, 0, "1,2(x2)", 5));
  EXPECT_NE(single.find("this srun step runs up to 2 ddp-launch tasks on a node (SLURM_STEP_TASKS_PER_NODE=1,2(x2))"),
            std::string::npos)
      << single;
  EXPECT_NE(single.find("srun -n 3 --ntasks-per-node=1"), std::string::npos) << single;
}

TEST(SrunLayout, OneLauncherPerNodeMustBeToldTheNodes) {
  LaunchOptions options;
  const std::string error = errorOf(options, srunTask(1, 1, "1(x2)", 2));
  EXPECT_NE(error.find("runs on 2 nodes of this srun step (SLURM_NODEID=1) but was given --nnodes=1 --node_rank=0"),
            std::string::npos)
      << error;
  options.nnodes = 2;
  options.nodeRank = 1;
  EXPECT_EQ(errorOf(options, srunTask(1, 1, "1(x2)", 2)), "");
}

TEST(SrunLayout, OutsideAnSrunStepNothingIsChecked) {
  LaunchOptions options;
  EXPECT_EQ(errorOf(options, {}), "");
  // An sbatch script's own shell is the batch step, not a task of an srun step.
  EnvMap batch = srunTask(0, 0, "2", 2);
  batch["SLURM_STEP_ID"] = "4294967294";
  EXPECT_EQ(errorOf(options, batch), "");
  // One task on one node: a single-node job, as given.
  EXPECT_EQ(errorOf(options, srunTask(0, 0, "1", 1)), "");
  // A step id without SLURM_STEP_TASKS_PER_NODE (some environments pass SLURM_STEP_ID on): no step to
  // lay out; it was refused with "SLURM_STEP_TASKS_PER_NODE='' is not like 2(x3),1" for a moment.
  EnvMap stepIdOnly = {{"SLURM_JOB_ID", "77"}, {"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "3"}};
  EXPECT_EQ(errorOf(options, stepIdOnly), "");
  LaunchOptions asGiven;
  EXPECT_EQ(applySrunStep(asGiven, stepIdOnly), "");
}

// The environment srun gave the task on node 1 of `srun -N2 --ntasks-per-node=1 ddp-launch ...`
// (Slurm 22.05, captured from scripts/slurm_cluster.sh's two-node cluster), plus the GPU
// variables a node with gres/gpu adds.
EnvMap twoNodeStep(int nodeId) {
  return {{"SLURM_JOB_ID", "123456"},          {"SLURM_STEP_ID", "0"},
          {"SLURM_PROCID", std::to_string(nodeId)}, {"SLURM_NODEID", std::to_string(nodeId)},
          {"SLURM_LOCALID", "0"},              {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
          {"SLURM_STEP_NUM_TASKS", "2"},       {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_STEP_NODELIST", "gpu[07-08]"}, {"SLURM_JOB_NODELIST", "gpu[03,07-08]"},
          {"SLURM_CPUS_ON_NODE", "16"}};
}

TEST(SrunStep, OneLauncherPerNodeTakesTheJobFromTheStep) {
  LaunchOptions options;
  const std::string line = applySrunStep(options, twoNodeStep(1));
  EXPECT_EQ(options.nnodes, 2);
  EXPECT_EQ(options.nodeRank, 1);
  EXPECT_EQ(options.masterAddr, "gpu07");  // node 0 of the step, not of the job
  ASSERT_TRUE(options.masterPort.has_value());
  EXPECT_EQ(*options.masterPort, 20000 + 123456 % 10000);
  EXPECT_EQ(options.nprocPerNode, 16);  // no GPUs: one worker per CPU, as torchrun's auto
  EXPECT_EQ(line, "under srun (job 123456 step 0, node 1 of 2): --nnodes=2 --node_rank=1 --master_addr=gpu07 "
                  "--master_port=23456 --nproc_per_node=16 (SLURM_CPUS_ON_NODE=16)");
  EXPECT_NO_THROW(checkSrunLayout(options, twoNodeStep(1)));
  // Another step of the job, running beside it: another port.
  EnvMap second = twoNodeStep(1);
  second["SLURM_STEP_ID"] = "1";
  LaunchOptions other;
  applySrunStep(other, second);
  EXPECT_EQ(*other.masterPort, 20000 + (123456 % 10000 + 1009) % 10000);
}

TEST(SrunStep, GpusOutrankCpusAndCpusPerTaskOutranksTheNode) {
  EnvMap env = twoNodeStep(0);
  env["SLURM_CPUS_PER_TASK"] = "4";
  LaunchOptions cpus;
  applySrunStep(cpus, env);
  EXPECT_EQ(cpus.nprocPerNode, 4);
  env["SLURM_STEP_GPUS"] = "0,1,3";
  LaunchOptions stepGpus;
  applySrunStep(stepGpus, env);
  EXPECT_EQ(stepGpus.nprocPerNode, 3);
  env["SLURM_GPUS_ON_NODE"] = "2";
  LaunchOptions gpusOnNode;
  applySrunStep(gpusOnNode, env);
  EXPECT_EQ(gpusOnNode.nprocPerNode, 2);
}

TEST(SrunStep, WhatTheCommandLineGivesIsKept) {
  LaunchOptions options;
  options.nprocPerNode = 3;
  options.nprocPerNodeGiven = true;
  options.masterAddr = "10.0.0.5";
  options.masterAddrGiven = true;
  options.masterPort = 29400;
  applySrunStep(options, twoNodeStep(0));
  EXPECT_EQ(options.nprocPerNode, 3);
  EXPECT_EQ(options.masterAddr, "10.0.0.5");
  EXPECT_EQ(*options.masterPort, 29400);
  EXPECT_EQ(options.nnodes, 2);
  // A contradicting --nnodes stays and is refused by the layout check.
  LaunchOptions wrong;
  wrong.nnodesGiven = true;
  wrong.nodeRankGiven = true;
  applySrunStep(wrong, twoNodeStep(0));
  EXPECT_EQ(wrong.nnodes, 1);
  EXPECT_NE(errorOf(wrong, twoNodeStep(1)).find("drop --nnodes and --node_rank"), std::string::npos);
}

TEST(SrunStep, SingleNodeStepsKeepLoopbackAndAFreePort) {
  EnvMap env = twoNodeStep(0);
  env["SLURM_STEP_TASKS_PER_NODE"] = "1";
  env["SLURM_STEP_NUM_TASKS"] = "1";
  env["SLURM_STEP_NUM_NODES"] = "1";
  env["SLURM_STEP_NODELIST"] = "gpu07";
  LaunchOptions options;
  applySrunStep(options, env);
  EXPECT_EQ(options.nnodes, 1);
  EXPECT_EQ(options.masterAddr, "127.0.0.1");
  EXPECT_FALSE(options.masterPort.has_value());
  EXPECT_EQ(options.nprocPerNode, 16);
}

TEST(SrunStep, NothingIsDerivedOutsideAStepOrWithSeveralTasksPerNode) {
  LaunchOptions options;
  EXPECT_EQ(applySrunStep(options, {}), "");
  EnvMap batch = twoNodeStep(0);
  batch["SLURM_STEP_ID"] = "4294967294";
  EXPECT_EQ(applySrunStep(options, batch), "");
  EXPECT_EQ(applySrunStep(options, srunTask(1, 0, "2", 2)), "");
  EXPECT_EQ(options.nnodes, 1);
  EXPECT_EQ(options.nprocPerNode, 1);
}

}  // namespace
}  // namespace ddp::launcher
