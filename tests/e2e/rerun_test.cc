// A job run again over an earlier run's output.dir or checkpoint.dir loses nothing: a finished run
// resumed again (a Slurm requeue, a restart loop) leaves its outputs as they were (and replaces a
// shorter run's), a fresh run is
// refused where its saves would mix with another run's checkpoints, and mode eval in the training
// run's output.dir keeps that run's summary.json. An output.dir deleted while its job runs is made
// again, with the records from then on and the outputs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/run_command.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

const std::string kConfig = std::string(DDP_SOURCE_DIR) + "/configs/synthetic_mlp.yaml";

test::CommandResult launch(int nproc, const std::string& out, std::vector<std::string> extra) {
  std::vector<std::string> argv = {DDP_LAUNCH_BIN, "--nproc_per_node=" + std::to_string(nproc), DDP_WORKER_BIN,
                                   kConfig, "output.dir=" + out};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return test::runCommand(argv, 120);
}

// Every file under `dir` with its bytes, to tell "left as it was" from "rewritten".
std::vector<std::pair<std::string, std::string>> contents(const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) {  // the lock files too: a run that ends removes its own
      files.emplace_back(e.path().string(), test::readFile(e.path().string()));
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(Rerun, AFinishedRunResumedAgainLeavesItsOutputsAsTheyWere) {
  const std::string out = test::makeTempDir("rerun_done");
  const auto shorter = launch(2, out, {"train.max_steps=3", "checkpoint.every_steps=3", "resume=auto"});
  ASSERT_EQ(shorter.exitCode, 0) << shorter.output;
  const std::string shortSummary = test::readFile(out + "/summary.json"), shortModel = test::readFile(out + "/model.pt");
  // A warm-up longer than the run: said by the run that takes steps, not by one that takes none.
  const std::string warmUp = "train.warmup_steps is 10 but the run has 6 optimizer steps";
  const std::vector<std::string> job = {"train.max_steps=6", "checkpoint.every_steps=3", "resume=auto",
                                        "train.warmup_steps=10"};
  const auto first = launch(2, out, job);  // extended to 6 steps
  ASSERT_EQ(first.exitCode, 0) << first.output;
  EXPECT_NE(first.output.find(warmUp), std::string::npos) << first.output;
  const auto before = contents(out);
  const double loss = nlohmann::json::parse(test::readFile(out + "/summary.json"))["final_loss"].get<double>();

  const auto again = launch(2, out, job);
  ASSERT_EQ(again.exitCode, 0) << again.output;
  EXPECT_NE(again.output.find("nothing left to train: the checkpoint is at the run's end (step 6); summary.json and "
                              "model.pt of the run that took the steps are left as they are"), std::string::npos)
      << again.output;
  EXPECT_EQ(again.output.find("train.warmup_steps is"), std::string::npos) << again.output;
  EXPECT_EQ(contents(out), before) << "a run with nothing to train rewrote the outputs";
  EXPECT_GT(loss, 0.0);

  // The outputs are the shorter run's (the extension was preempted after its last checkpoint, before
  // its export): evaluated and exported anew, with no final loss made up for a step not taken here.
  std::ofstream(out + "/summary.json") << shortSummary;
  std::ofstream(out + "/model.pt", std::ios::binary) << shortModel;
  const auto repair = launch(2, out, job);
  ASSERT_EQ(repair.exitCode, 0) << repair.output;
  EXPECT_NE(repair.output.find("no step taken by this run"), std::string::npos) << repair.output;
  const auto summary = nlohmann::json::parse(test::readFile(out + "/summary.json"));
  EXPECT_EQ(summary["steps"], 6);
  EXPECT_TRUE(summary["final_loss"].is_null()) << summary.dump();
  EXPECT_NE(test::readFile(out + "/model.pt"), shortModel);
  fs::remove_all(out);
}

TEST(Rerun, AFreshRunAmongAnotherRunsCheckpointsIsRefused) {
  const std::string out = test::makeTempDir("rerun_fresh");
  const auto first = launch(2, out, {"train.max_steps=12", "checkpoint.every_steps=6"});
  ASSERT_EQ(first.exitCode, 0) << first.output;
  const auto before = contents(out + "/checkpoints");
  ASSERT_EQ(before.size(), 2u);

  // Its ckpt-2 and ckpt-4 would have ranked below the earlier ckpt-12 (and keep_last 1 pruned them).
  const auto fresh = launch(2, out + "/fresh", {"checkpoint.dir=" + out + "/checkpoints", "train.max_steps=4",
                                                "checkpoint.every_steps=2", "checkpoint.keep_last=1"});
  EXPECT_EQ(fresh.exitCode, 2) << fresh.output;
  EXPECT_NE(fresh.output.find("config: checkpoint.dir " + out + "/checkpoints holds an earlier run's checkpoints (2, "
                              "the newest ckpt-00000012.pt) and this run starts fresh (resume is unset)"),
            std::string::npos) << fresh.output;
  EXPECT_NE(fresh.output.find("use resume=auto to continue that run"), std::string::npos) << fresh.output;
  EXPECT_EQ(contents(out + "/checkpoints"), before);
  EXPECT_FALSE(fs::exists(out + "/fresh")) << "the refused run left its output.dir behind";

  const auto resumed = launch(2, out + "/fresh", {"checkpoint.dir=" + out + "/checkpoints", "train.max_steps=14",
                                                  "checkpoint.every_steps=2", "resume=auto"});
  EXPECT_EQ(resumed.exitCode, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("ckpt-00000012.pt"), std::string::npos) << resumed.output;
  fs::remove_all(out);
}

// output.dir removed mid-run (a clean-up of old runs, a tmp cleaner): the workers are frozen
// (SIGSTOP) after the checkpoint of step 50 while step 300's record is still to come, the directory
// is deleted, and they go on. Each rank makes its records again from its next logged step, rank 0
// says so and takes the job's locks again (output.dir's at once, checkpoint.dir's at its next save),
// and the checkpoints, the export and summary.json land there; the job succeeds.
TEST(Rerun, AnOutputDirDeletedWhileTheJobRunsIsMadeAgain) {
  const std::string logs = test::makeTempDir("rerun_deleted_log");
  const std::string out = logs + "/out";
  const std::vector<std::string> argv = {DDP_LAUNCH_BIN, "--nproc_per_node=2", DDP_WORKER_BIN, kConfig,
                                         "output.dir=" + out, "model.hidden=[1024,1024]", "train.max_steps=300",
                                         "train.epochs=1000", "train.log_every=10", "checkpoint.every_steps=50",
                                         "output.sample_log=true", "output.tensorboard=true"};
  test::Background job(argv, logs + "/job.log");
  std::vector<pid_t> workers;
  // Once `text` is in the log: both workers frozen, `look` run, both continued. The run must not
  // have logged its last step yet (it removes its locks as it ends).
  const auto frozenAfter = [&](const std::string& text, const std::function<void()>& look) {
    ASSERT_TRUE(job.waitFor(text, 120)) << test::readFile(job.log);
    if (workers.empty()) workers = test::childrenOf(job.pid);
    ASSERT_EQ(workers.size(), 2u) << test::readFile(job.log);
    for (pid_t w : workers) ::kill(w, SIGSTOP);
    for (pid_t w : workers) test::waitUntilStopped(w);
    const bool ended = test::readFile(job.log).find("step 300/300") != std::string::npos;
    if (!ended) look();
    for (pid_t w : workers) ::kill(w, SIGCONT);
    ASSERT_FALSE(ended) << "the run logged its last step before the test froze it after '" << text << "'";
  };
  // The lock file's holder: one of the workers (rank 0).
  const auto expectHeld = [&](const std::string& dir) {
    const std::string lock = test::readFile(dir + "/.ddp-launch.lock");
    const std::string holder = lock.substr(0, lock.find('\n'));
    EXPECT_TRUE(holder == std::to_string(workers[0]) || holder == std::to_string(workers[1])) << dir << ": " << lock;
  };
  ASSERT_NO_FATAL_FAILURE(frozenAfter("ckpt-00000050.pt", [&] { fs::remove_all(out); }));
  ASSERT_NO_FATAL_FAILURE(frozenAfter("was deleted while the job ran", [&] { expectHeld(out); }));
  ASSERT_NO_FATAL_FAILURE(frozenAfter("ckpt-00000100.pt", [&] { expectHeld(out + "/checkpoints"); }));
  ASSERT_EQ(job.wait(120), 0) << test::readFile(job.log);
  const std::string log = test::readFile(job.log);
  EXPECT_NE(log.find("output.dir: " + out + "/metrics.jsonl was deleted while the job ran"), std::string::npos) << log;
  // metrics.jsonl anew: from a step after the delete to the last one.
  std::istringstream lines(test::readFile(out + "/metrics.jsonl"));
  std::vector<int64_t> steps;
  for (std::string line; std::getline(lines, line);) steps.push_back(nlohmann::json::parse(line)["step"].get<int64_t>());
  ASSERT_FALSE(steps.empty());
  EXPECT_GT(steps.front(), 50);
  EXPECT_EQ(steps.back(), 300);
  EXPECT_NE(test::readFile(out + "/config.resolved.yaml").find("max_steps: 300"), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(test::readFile(out + "/summary.json"))["steps"], 300);
  EXPECT_TRUE(fs::exists(out + "/model.pt"));
  EXPECT_TRUE(fs::exists(out + "/checkpoints/ckpt-00000300.pt"));
  EXPECT_TRUE(fs::is_directory(out + "/tensorboard"));
  for (int rank = 0; rank < 2; ++rank) {  // each rank's sample log ("epoch step i0 i1 ..."), anew up to step 300
    std::istringstream samples(test::readFile(out + "/samples_rank" + std::to_string(rank) + ".txt"));
    std::string header;
    std::getline(samples, header);
    EXPECT_EQ(header, "# restart 0 world 2") << rank;
    std::vector<int64_t> logged;
    for (std::string line; std::getline(samples, line);) {
      int64_t epoch = -1, step = -1;
      std::istringstream(line) >> epoch >> step;
      logged.push_back(step);
    }
    ASSERT_FALSE(logged.empty()) << rank;
    EXPECT_GT(logged.front(), 50) << rank;
    EXPECT_EQ(logged.back(), 300) << rank;
  }
  fs::remove_all(logs);
}

TEST(Rerun, AnEvaluationInTheTrainingRunsDirectoryKeepsItsSummary) {
  const std::string out = test::makeTempDir("rerun_eval");
  const auto trained = launch(2, out, {"train.max_steps=5"});
  ASSERT_EQ(trained.exitCode, 0) << trained.output;
  const std::string summary = test::readFile(out + "/summary.json");
  const int64_t total = nlohmann::json::parse(summary)["test_total"].get<int64_t>();

  const auto eval = test::runCommand({DDP_WORKER_BIN, kConfig, "mode=eval", "eval.model_path=" + out + "/model.pt",
                                      "output.dir=" + out}, 120);
  ASSERT_EQ(eval.exitCode, 0) << eval.output;
  EXPECT_EQ(test::readFile(out + "/summary.json"), summary);
  const auto evaluated = nlohmann::json::parse(test::readFile(out + "/eval.json"));
  EXPECT_EQ(evaluated["mode"], "eval");
  EXPECT_EQ(evaluated["test_total"], total);
  fs::remove_all(out);
}

}  // namespace
}  // namespace ddp
