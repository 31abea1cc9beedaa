// Bad input that is not one launch of the table: two jobs on one directory, planted symlinks, a
// token file of another user, a store that never answers or drops the connection, closed standard
// streams, an mpirun rank without MASTER_ADDR — each a clear line, a non-zero exit, nothing left behind.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <poll.h>

#include <atomic>
#include <thread>

#include <filesystem>
#include <fstream>

#include "tests/e2e/bad_input_support.h"
#include "tests/support/loopback.h"
#include "tests/support/run_command.h"

namespace ddp {
namespace {

using namespace bad_input;

// Issue 46 (6, 8): two jobs, two output.dirs, one checkpoint.dir: a fresh job B with resume=auto used
// to resume from job A's checkpoint and then die when A's save removed its temporary; and one
// --log_dir. Both refused at start. So is a job B that saves only on a stop signal (no schedule,
// no resume): its save would have pruned A's checkpoints.
TEST(OutputDir, ASecondJobOnTheSameCheckpointDirIsRefused) {
  const std::string dir = test::makeTempDir("ddp_two_ckpt");
  test::Background first({DDP_LAUNCH_BIN, "--nproc_per_node=1", "--log_dir=" + dir + "/logs", "--tee", DDP_WORKER_BIN,
                          kConfig, "output.dir=" + dir + "/a", "checkpoint.dir=" + dir + "/ckpt", "checkpoint.every_steps=1000", "train.epochs=100000",
                          "train.log_every=1"},
                         dir + "/first.log");
  ASSERT_TRUE(first.waitFor("step 1/", 120)) << test::readFile(first.log);
  for (const std::string saving : {"checkpoint.every_steps=5 resume=auto", "checkpoint.every_steps=0 resume=auto",
                                   "checkpoint.every_steps=0 resume="}) {
    const auto second = test::runCommand({DDP_LAUNCH_BIN, "--nproc_per_node=2", DDP_WORKER_BIN, kConfig,
                                          "output.dir=" + dir + "/b", "checkpoint.dir=" + dir + "/ckpt",
                                          saving.substr(0, saving.find(' ')), saving.substr(saving.find(' ') + 1),
                                          "train.max_steps=2"},
                                         90);
    EXPECT_EQ(second.exitCode, 2) << saving << ":\n" << second.output;
    EXPECT_NE(second.output.find("config: 'checkpoint.dir' " + dir + "/ckpt is in use by another job (pid "),
              std::string::npos)
        << saving << ":\n" << second.output;
  }
  // Issue 46 (8): the same --log_dir for a second job would truncate the first's rank_0.log.
  const std::string firstLog = test::readFile(dir + "/logs/rank_0.log");
  const auto third = test::runCommand({DDP_LAUNCH_BIN, "--nproc_per_node=1", "--log_dir=" + dir + "/logs",
                                       DDP_WORKER_BIN, kConfig, "output.dir=" + dir + "/c", "train.max_steps=2"},
                                      90);
  EXPECT_EQ(third.exitCode, 2) << third.output;
  EXPECT_NE(third.output.find("--log_dir '" + dir + "/logs' is in use by another job (pid "), std::string::npos)
      << third.output;
  EXPECT_GE(test::readFile(dir + "/logs/rank_0.log").size(), firstLog.size()) << "the first job's log was truncated";
  ::kill(-first.pid, SIGTERM);
  EXPECT_GE(first.wait(60), 0) << test::readFile(first.log);
  std::filesystem::remove_all(dir);
}

// Issue 46 (2): symbolic links planted where the job writes its metrics, sample log or per-rank log
// are refused in one line; nothing is written through them (the target keeps its bytes).
TEST(OutputDir, PlantedSymlinksAreNotWrittenThrough) {
  const std::string dir = test::makeTempDir("ddp_planted");
  const std::string victim = dir + "/victim";
  const auto plant = [&](const std::string& where) {
    std::ofstream(victim) << "precious\n";
    fs::create_directories(fs::path(where).parent_path());
    fs::remove(where);
    fs::create_symlink(victim, where);
  };
  struct Case {
    std::string link;
    std::vector<std::string> extra;
    std::string expected;
  };
  const Case cases[] = {
      {dir + "/m/metrics.jsonl", {"output.dir=" + dir + "/m"}, "metrics.jsonl': it is a symbolic link"},
      {dir + "/s/samples_rank0.txt", {"output.dir=" + dir + "/s", "output.sample_log=true"},
       "samples_rank0.txt': it is a symbolic link"},
      {dir + "/logs/rank_0.log", {"output.dir=" + dir + "/l"}, "rank_0.log': it is a symbolic link"}};
  for (const Case& c : cases) {
    plant(c.link);
    std::vector<std::string> argv = {DDP_LAUNCH_BIN, "--nproc_per_node=1"};
    if (c.link.find("/logs/") != std::string::npos) argv.push_back("--log_dir=" + dir + "/logs");
    for (const std::string& a : {std::string(DDP_WORKER_BIN), kConfig, std::string("train.max_steps=2")}) argv.push_back(a);
    argv.insert(argv.end(), c.extra.begin(), c.extra.end());
    const auto r = test::runCommand(argv, 120);
    EXPECT_NE(r.exitCode, 0) << c.link << ":\n" << r.output;
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << c.link << ":\n" << r.output;
    EXPECT_EQ(test::readFile(victim), "precious\n") << c.link;
  }
  fs::remove_all(dir);
}

// Issue 46 (3): a token file another user owns is refused, directly or through a symlink: its owner
// could change the job's secret. Giving a file away takes root (CI runs as root).
TEST(TokenFile, AFileOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "only root can give a file to another user";
  Fixture f;
  std::string tmpl = (fs::temp_directory_path() / "ddp_bad_XXXXXX").string();
  f.dir = ::mkdtemp(tmpl.data());
  const std::string path = tokenFile(f);
  ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);  // nobody
  const std::string link = f.dir + "/link.token";
  ASSERT_EQ(::symlink(path.c_str(), link.c_str()), 0);
  for (const std::string& given : {path, link}) {
    const auto r = test::runCommand({DDP_LAUNCH_BIN, "--nnodes=2", "--node_rank=1", "--master_port=1",
                                     "--rdzv_token_file=" + given, DDP_WORKER_BIN, kConfig, "output.dir=" + f.dir + "/out"},
                                    60);
    EXPECT_EQ(r.exitCode, 2) << r.output;
    EXPECT_NE(r.output.find("belongs to user id 65534, not to this user"), std::string::npos) << r.output;
  }
  fs::remove_all(f.dir);
}

// Two jobs, one output.dir (issue 30): the second is refused with one line naming the first's pid,
// instead of both overwriting (and deleting the temporaries of) each other's files.
TEST(OutputDir, ASecondJobOnTheSameOutputDirIsRefused) {
  const std::string dir = test::makeTempDir("ddp_two_jobs");
  test::Background first({DDP_LAUNCH_BIN, "--nproc_per_node=1", DDP_WORKER_BIN, kConfig, "output.dir=" + dir + "/out",
                          "train.epochs=100000", "train.log_every=1"},
                         dir + "/first.log");
  ASSERT_TRUE(first.waitFor("step 1/", 120)) << test::readFile(first.log);
  const auto second = test::runCommand({DDP_LAUNCH_BIN, "--nproc_per_node=2", DDP_WORKER_BIN, kConfig,
                                        "output.dir=" + dir + "/out", "train.max_steps=2"},
                                       90);
  EXPECT_EQ(second.exitCode, 2) << second.output;
  EXPECT_NE(second.output.find("config: 'output.dir' " + dir + "/out is in use by another job (pid "),
            std::string::npos)
      << second.output;
  ::kill(-first.pid, SIGTERM);
  EXPECT_GE(first.wait(60), 0) << test::readFile(first.log);  // it stops on the signal, as any job
  EXPECT_EQ(test::readFile(first.log).find("worker:"), std::string::npos) << test::readFile(first.log);
  std::filesystem::remove_all(dir);
}

// Issue 15 (7): a store that takes the connection but never answers (a peer left half a request
// on it, or it speaks another protocol version) held the rank forever. Here the "store" is a
// socket that listens and never accepts: the kernel completes the connection, nothing replies.
// The rank must end within comm.timeout_s (plus the start-up grace) with one line naming the store.
TEST(StartUp, AStoreThatNeverAnswersEndsTheRankWithinTheTimeout) {
  const std::string dir = test::makeTempDir("ddp_silent_store");
  const int silent = test::listenLoopback();
  const std::string where = "127.0.0.1:" + std::to_string(test::boundPort(silent));
  // This node is rank 1 of 2: its worker is a client of "rank 0's" store at the silent port.
  Fixture f;
  f.dir = dir;
  const auto r = test::runCommand({DDP_LAUNCH_BIN, "--nnodes=2", "--node_rank=1", "--nproc_per_node=1",
                                   "--master_port=" + std::to_string(test::boundPort(silent)), "--rdzv_token_file=" + tokenFile(f),
                                   DDP_WORKER_BIN, kConfig,
                                   "output.dir=" + dir + "/out", "comm.timeout_s=3"},
                                  60);
  ::close(silent);
  EXPECT_FALSE(r.timedOut) << "the rank hung on a store that never answers:\n" << r.output;
  EXPECT_NE(r.exitCode, 0) << r.output;
  // LibTorch's client (1.13 and 2.15 alike) blocks in its read; the start-up watchdog ends it
  // ("got no answer"). Should a client time out by itself, "could not reach" is as good.
  const bool named = r.output.find("could not reach rank 0 at " + where) != std::string::npos ||
                     r.output.find("got no answer from the store at " + where) != std::string::npos;
  EXPECT_TRUE(named) << r.output;
  EXPECT_EQ(r.output.find("Exception raised from"), std::string::npos) << r.output;
  EXPECT_EQ(processesMentioning(dir), 0) << "a process outlived the launcher";
  fs::remove_all(dir);
}

// Issue 14 (2): a rank other than 0 started without a launcher (as srun starts it) meets a port
// whose owner accepts and at once closes every connection. One "worker:" line and exit 1: no
// std::terminate from a background thread, no c10d warning with a C++ stack trace.
TEST(StartUp, ARankWithoutALauncherReportsADroppedStoreInOneLine) {
  const int closer = test::listenLoopback();
  const int port = test::boundPort(closer);
  std::atomic<bool> done{false};
  std::thread acceptor([&] {
    while (!done) {
      pollfd p{closer, POLLIN, 0};
      if (::poll(&p, 1, 100) > 0) {
        const int c = ::accept(closer, nullptr, nullptr);
        if (c >= 0) ::close(c);
      }
    }
  });
  const std::string dir = test::makeTempDir("ddp_dropped_store");
  const auto r = test::runCommand({"/usr/bin/env", "-u", "TORCH_CPP_LOG_LEVEL", "RANK=1", "WORLD_SIZE=2",
                                   "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port), DDP_WORKER_BIN,
                                   kConfig, "output.dir=" + dir + "/out", "comm.timeout_s=3"},
                                  60);
  done = true;
  acceptor.join();
  ::close(closer);
  EXPECT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 1) << r.output;
  EXPECT_NE(r.output.find("worker: rendezvous: rank 1 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << r.output;
  for (const char* noise : {"terminate called", "Exception raised from", "frame #", "[W"}) {
    EXPECT_EQ(r.output.find(noise), std::string::npos) << noise << " in:\n" << r.output;
  }
  fs::remove_all(dir);
}

// A rank of `mpirun -np 4 -H a:2,b:2 worker` (Open MPI 4.1's variables for it) without MASTER_ADDR:
// Open MPI does not say where rank 0 runs, so the rank stops with one line saying what to export.
// Issue 46 (11): a job started with stdout or stderr closed (`>&-`) trains as any other; the
// store's listening socket used to take fd 1, and rank 0 refused it as DDP_STORE_FD=1.
TEST(StartUp, AClosedStdoutOrStderrDoesNotBreakTheJob) {
  std::string tmpl = (fs::temp_directory_path() / "ddp_bad_XXXXXX").string();
  const std::string dir = ::mkdtemp(tmpl.data());
  for (const std::string closed : {">&-", "2>&-"}) {
    const std::string out = dir + "/out" + std::to_string(closed.size());
    const auto r = test::runCommand({"/bin/sh", "-c", "exec \"$0\" --nproc_per_node=2 \"$1\" \"$2\" output.dir=\"$3\" "
                                     "train.max_steps=3 eval.enabled=false " + closed,
                                     DDP_LAUNCH_BIN, DDP_WORKER_BIN, kConfig, out},
                                    120);
    EXPECT_EQ(r.exitCode, 0) << closed << ":\n" << r.output;
    EXPECT_TRUE(fs::exists(out + "/summary.json")) << closed << ":\n" << r.output;
    if (closed == "2>&-") {  // stdout open: the last line, without the accuracy of an evaluation not run
      EXPECT_NE(r.output.find("done: 3 steps"), std::string::npos) << r.output;
      EXPECT_EQ(r.output.find("test accuracy"), std::string::npos) << r.output;
    }
  }
  fs::remove_all(dir);
}

TEST(StartUp, AMultiHostMpirunRankWithoutMasterAddrSaysWhatToExport) {
  const std::string dir = test::makeTempDir("ddp_mpirun_hosts");
  const auto r = test::runCommand({"/usr/bin/env", "-u", "MASTER_ADDR", "-u", "MASTER_PORT", "-u", "RANK",
                                   "OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=0",
                                   "OMPI_COMM_WORLD_LOCAL_SIZE=2", "OMPI_COMM_WORLD_NODE_RANK=0",
                                   "OMPI_MCA_orte_num_nodes=2", "OMPI_MCA_ess_base_jobid=1989214209", DDP_WORKER_BIN,
                                   kConfig, "output.dir=" + dir + "/out"},
                                  60);
  EXPECT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 2) << r.output;
  EXPECT_NE(r.output.find("worker: environment: mpirun started the 4 ranks on 2 hosts"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("mpirun -x MASTER_ADDR -x MASTER_PORT"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/out/summary.json"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ddp
