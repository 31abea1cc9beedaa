// Unit tests of the environment and arguments each worker gets.
#include "launcher/worker_env.h"

#include <cstdlib>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace ddp::launcher {
namespace {

LaunchOptions options(int nnodes, int nodeRank, int nproc) {
  LaunchOptions result;
  result.nnodes = nnodes;
  result.nodeRank = nodeRank;
  result.nprocPerNode = nproc;
  result.masterAddr = "10.0.0.1";
  return result;
}

TEST(WorkerEnv, ContractFollowsTheTorchrunFormulas) {
  for (const auto& [nnodes, nodeRank, nproc] : {std::tuple{1, 0, 1}, {1, 0, 3}, {2, 1, 4}, {3, 2, 2}}) {
    const LaunchOptions launch = options(nnodes, nodeRank, nproc);
    for (int local = 0; local < nproc; ++local) {
      SCOPED_TRACE(testing::Message() << "nnodes " << nnodes << " node " << nodeRank << " local " << local);
      const EnvMap env = workerEnvironment(launch, local, 29123, {});
      const std::string rank = std::to_string(nodeRank * nproc + local);
      const std::string world = std::to_string(nnodes * nproc);
      EXPECT_EQ(env.at("RANK"), rank);
      EXPECT_EQ(env.at("LOCAL_RANK"), std::to_string(local));
      EXPECT_EQ(env.at("WORLD_SIZE"), world);
      EXPECT_EQ(env.at("GROUP_WORLD_SIZE"), std::to_string(nnodes));
      EXPECT_EQ(env.at("ROLE_NAME"), "default");
      EXPECT_EQ(env.at("TORCHELASTIC_RUN_ID"), "none");  // torchrun's default --rdzv_id
      EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), std::to_string(nproc));
      EXPECT_EQ(env.at("GROUP_RANK"), std::to_string(nodeRank));
      EXPECT_EQ(env.at("ROLE_RANK"), rank);
      EXPECT_EQ(env.at("ROLE_WORLD_SIZE"), world);
      EXPECT_EQ(env.at("MASTER_ADDR"), "10.0.0.1");
      EXPECT_EQ(env.at("MASTER_PORT"), "29123");
      EXPECT_EQ(env.at("TORCHELASTIC_RESTART_COUNT"), "0");
      EXPECT_EQ(env.at("DDP_LAUNCH_PREFIXED"), "1");
      EXPECT_EQ(env.at("GLOG_minloglevel"), "3");
      EXPECT_EQ(env.at("TORCH_CPP_LOG_LEVEL"), "FATAL");
    }
  }
}

// A Python worker gets torchrun's environment (e2e_torchrun compares it with torchrun's own):
// PyTorch's log levels untouched, TORCH_NCCL_ASYNC_ERROR_HANDLING=1 unless set; a C++ worker keeps
// LibTorch's log lines out of its one-line errors and gets no NCCL setting of torchrun's agent.
TEST(WorkerEnv, APythonWorkerGetsTorchrunsLogLevelsAndNcclErrorHandling) {
  LaunchOptions python = options(1, 0, 2);
  python.worker = "python3";
  const EnvMap env = workerEnvironment(python, 0, 29123, {});
  EXPECT_EQ(env.count("TORCH_CPP_LOG_LEVEL"), 0u);
  EXPECT_EQ(env.count("GLOG_minloglevel"), 0u);
  EXPECT_EQ(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
  EXPECT_EQ(workerEnvironment(python, 0, 29123, {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}}).at("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "3");
  EXPECT_EQ(workerEnvironment(python, 0, 29123, {{"TORCH_CPP_LOG_LEVEL", "INFO"}}).at("TORCH_CPP_LOG_LEVEL"), "INFO");
  LaunchOptions native = options(1, 0, 2);
  native.worker = "./worker";
  const EnvMap ours = workerEnvironment(native, 0, 29123, {});
  EXPECT_EQ(ours.at("TORCH_CPP_LOG_LEVEL"), "FATAL");
  EXPECT_EQ(ours.count("TORCH_NCCL_ASYNC_ERROR_HANDLING"), 0u);
}

// Python under another name: a #! script, a shell entrypoint that execs python, env/nsys/uv given
// python or a .py; not a program or a script that runs no Python (those may take the store socket).
TEST(WorkerEnv, WorkersThatRunPythonAreKnownWhateverTheirName) {
  std::string tmpl = ::testing::TempDir() + "worker_env_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl;
  const auto script = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  LaunchOptions o;
  const auto runs = [&](const std::string& worker, std::vector<std::string> args, const std::string& path) {
    o.worker = worker;
    o.workerArgs = std::move(args);
    return workerRunsPython(o, path);
  };
  EXPECT_TRUE(runs("python3", {"train.py"}, "/usr/bin/python3"));
  EXPECT_TRUE(runs("./train", {}, script("train", "#!/usr/bin/env python3\nimport torch\n")));
  EXPECT_TRUE(runs("./train.py", {}, script("train.py", "import torch\n")));
  EXPECT_TRUE(runs("./entrypoint.sh", {"--lr=1"}, script("entrypoint.sh", "#!/bin/sh\nset -e\nexec python3 -u train.py \"$@\"\n")));
  EXPECT_TRUE(runs("env", {"OMP_NUM_THREADS=4", "python3", "x.py"}, "/usr/bin/env"));
  EXPECT_TRUE(runs("nsys", {"profile", "-o", "p", "/opt/venv/bin/python", "x.py"}, "/usr/bin/nsys"));
  EXPECT_TRUE(runs("uv", {"run", "train.py"}, "/usr/bin/uv"));
  EXPECT_FALSE(runs("./worker", {"config.yaml", "train.lr=0.1"}, "/bin/sh"));  // a program: its bytes are not read as a script
  EXPECT_FALSE(runs("./run.sh", {"config.yaml"}, script("run.sh", "#!/bin/sh\nexec ./build/worker \"$@\"\n")));
  // A wrapper of a C++ worker that only mentions python keeps the launcher's store socket.
  EXPECT_FALSE(runs("./hpc.sh", {"config.yaml"},
                    script("hpc.sh", "#!/bin/bash\n# needs python for the data step\nmodule load python/3.11\n"
                                     "source /opt/python/venv/bin/activate\nexec ./build/worker \"$@\"\n")));
  EXPECT_TRUE(runs("./conda.sh", {}, script("conda.sh", "#!/bin/bash\nconda run -n torch python -u train.py\n")));
  // Its environment is torchrun's.
  o.worker = "./train";
  o.workerArgs = {};
  o.workerRunsPython = true;
  EXPECT_EQ(workerEnvironment(o, 0, 29123, {}).at("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
  EXPECT_EQ(workerEnvironment(o, 0, 29123, {}).count("TORCH_CPP_LOG_LEVEL"), 0u);
  std::filesystem::remove_all(dir);
}

TEST(WorkerEnv, TellsTheWorkersWhetherTheConsoleIsATerminal) {
  LaunchOptions launch;
  EXPECT_EQ(workerEnvironment(launch, 0, 29123, {}).at("DDP_PROGRESS"), "lines");
  launch.consoleIsTerminal = true;
  EXPECT_EQ(workerEnvironment(launch, 0, 29123, {}).at("DDP_PROGRESS"), "bar");
  EXPECT_EQ(workerEnvironment(launch, 0, 29123, {{"DDP_PROGRESS", "lines"}}).at("DDP_PROGRESS"), "lines");
}

TEST(WorkerEnv, KeepsTheInheritedEnvironmentButOverridesTheContract) {
  const EnvMap inherited{{"PATH", "/opt/bin"}, {"RANK", "99"}, {"MASTER_PORT", "1"}, {"CUSTOM", "x=y"}};
  const EnvMap env = workerEnvironment(options(1, 0, 2), 1, 4242, inherited);
  EXPECT_EQ(env.at("PATH"), "/opt/bin");
  EXPECT_EQ(env.at("CUSTOM"), "x=y");
  EXPECT_EQ(env.at("RANK"), "1");
  EXPECT_EQ(env.at("MASTER_PORT"), "4242");
}

TEST(WorkerEnv, OmpNumThreadsDefaultsToOneOnlyWhenUnsetAndSeveralWorkers) {
  EXPECT_EQ(workerEnvironment(options(1, 0, 2), 0, 1, {}).at("OMP_NUM_THREADS"), "1");
  EXPECT_EQ(workerEnvironment(options(1, 0, 2), 0, 1, {{"OMP_NUM_THREADS", "6"}}).at("OMP_NUM_THREADS"), "6");
  EXPECT_EQ(workerEnvironment(options(1, 0, 1), 0, 1, {}).count("OMP_NUM_THREADS"), 0u);
  EXPECT_TRUE(shouldDefaultOmpThreads(options(2, 0, 2), {}));
  EXPECT_FALSE(shouldDefaultOmpThreads(options(2, 0, 2), {{"OMP_NUM_THREADS", ""}}));
  EXPECT_FALSE(shouldDefaultOmpThreads(options(4, 0, 1), {}));
}

TEST(WorkerEnv, LegacyLocalRankArgumentOnlyWithoutUseEnv) {
  LaunchOptions launch = options(1, 0, 2);
  launch.workerArgs = {"config.yaml", "--local_rank=7"};
  EXPECT_EQ(workerArguments(launch, 1), launch.workerArgs);
  launch.useEnv = false;
  EXPECT_EQ(workerArguments(launch, 1), (std::vector<std::string>{"--local_rank=1", "config.yaml", "--local_rank=7"}));
}

TEST(WorkerEnv, LegacyLocalRankGoesAfterThePythonScriptAsTorchDistributedLaunchDoes) {
  LaunchOptions launch = options(1, 0, 2);
  launch.useEnv = false;
  using Args = std::vector<std::string>;
  launch.worker = "/usr/bin/python3.11";
  launch.workerArgs = {"-u", "-X", "dev", "-W", "ignore", "train.py", "--epochs", "2"};
  EXPECT_EQ(workerArguments(launch, 1), (Args{"-u", "-X", "dev", "-W", "ignore", "train.py", "--local_rank=1", "--epochs", "2"}));
  launch.worker = "python";
  launch.workerArgs = {"-m", "pkg.train", "cfg"};
  EXPECT_EQ(workerArguments(launch, 0), (Args{"-m", "pkg.train", "--local_rank=0", "cfg"}));
  launch.workerArgs = {"train.py"};
  EXPECT_EQ(workerArguments(launch, 3), (Args{"train.py", "--local_rank=3"}));
  // Not an interpreter: first, as before.
  launch.worker = "./python_trainer";
  EXPECT_EQ(workerArguments(launch, 3), (Args{"--local_rank=3", "train.py"}));
  EXPECT_TRUE(isPythonInterpreter("python"));
  EXPECT_TRUE(isPythonInterpreter("/opt/venv/bin/python3.12"));
  EXPECT_FALSE(isPythonInterpreter("pythonista"));
  EXPECT_FALSE(isPythonInterpreter("./worker"));
}

TEST(WorkerEnv, CurrentEnvironmentReadsEnviron) {
  ::setenv("DDP_WORKER_ENV_TEST", "a=b", 1);
  EXPECT_EQ(currentEnvironment().at("DDP_WORKER_ENV_TEST"), "a=b");
  ::unsetenv("DDP_WORKER_ENV_TEST");
  EXPECT_EQ(currentEnvironment().count("DDP_WORKER_ENV_TEST"), 0u);
}

}  // namespace
}  // namespace ddp::launcher
