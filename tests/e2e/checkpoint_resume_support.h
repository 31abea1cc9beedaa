// What the checkpoint tests through the real programs share: the job's config, a scratch
// directory, a launch of the worker under ddp-launch, and the arguments of the resumed job.
#pragma once

#include <string>
#include <vector>

#include "tests/support/e2e_models.h"
#include "tests/support/run_command.h"

namespace ddp::resume_test {

inline const std::string kConfig = std::string(DDP_SOURCE_DIR) + "/configs/synthetic_mlp.yaml";

inline std::string tempDir() { return test::makeTempDir("resume"); }

inline test::CommandResult launch(int nproc, const std::vector<std::string>& workerArgs, int timeout = 300) {
  std::vector<std::string> argv = {DDP_LAUNCH_BIN, "--nproc_per_node=" + std::to_string(nproc), DDP_WORKER_BIN};
  argv.insert(argv.end(), workerArgs.begin(), workerArgs.end());
  return test::runCommand(argv, timeout);
}

inline std::vector<std::string> trainArgs(const std::string& out, const std::string& ckpt) {
  // 200 samples, 2 ranks × 8 per step → 13 steps per epoch: 30 steps cross two epoch boundaries.
  return {kConfig, "seed=5", "model.hidden=[32]", "data.synthetic_train=200", "data.synthetic_test=64",
          "train.batch_size=8", "train.epochs=10", "train.lr=0.05", "train.momentum=0.9",
          "output.dir=" + out, "output.dump_rank_params=true", "checkpoint.dir=" + ckpt,
          "checkpoint.every_steps=4", "checkpoint.keep_last=2"};
}

}  // namespace ddp::resume_test
