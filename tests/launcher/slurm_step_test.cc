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
  EXPECT_NE(error.find("--ntasks-per-node=1"), std::string::npos) << error;
  // Uneven layouts: node 1 of "1,2(x2)" runs two.
  EXPECT_NE(errorOf(options, srunTask(2, 1, "1,2(x2)", 5)).find("one of 2 srun tasks"), std::string::npos);
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
}

}  // namespace
}  // namespace ddp::launcher
