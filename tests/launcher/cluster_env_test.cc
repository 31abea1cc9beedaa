// Slurm hostlists and the job port (common/cluster_env.h). The expansions follow Slurm's
// documented hostlist syntax; tests/e2e/cluster_test.cc checks them against `scontrol show
// hostnames` of a real Slurm.
#include "common/cluster_env.h"

#include <gtest/gtest.h>

#include <set>

#include "common/error.h"

namespace ddp {
namespace {

using Hosts = std::vector<std::string>;

Hosts expand(const std::string& list) { return expandHostlist("SLURM_JOB_NODELIST", list); }

TEST(Hostlist, RangesKeepTheirWidthAndOrder) {
  EXPECT_EQ(expand("vm"), Hosts{"vm"});
  EXPECT_EQ(expand("a,b"), (Hosts{"a", "b"}));
  EXPECT_EQ(expand("node[01-03,7],gpu7"), (Hosts{"node01", "node02", "node03", "node7", "gpu7"}));
  EXPECT_EQ(expand("n[8-10]"), (Hosts{"n8", "n9", "n10"}));
  EXPECT_EQ(expand("d[009-011]"), (Hosts{"d009", "d010", "d011"}));
  // Several bracket groups: the first varies slowest.
  EXPECT_EQ(expand("b[1-2]-x[3-4]"), (Hosts{"b1-x3", "b1-x4", "b2-x3", "b2-x4"}));
  EXPECT_EQ(firstHost("SLURM_JOB_NODELIST", "gpu[07-08,11],cpu1"), "gpu07");
  EXPECT_EQ(firstHost("SLURM_JOB_NODELIST", "login,gpu[1-4]"), "login");
}

TEST(Hostlist, MalformedListsNameTheVariable) {
  for (const std::string bad : {"", "n[1-", "n1-2]", "n[2-1]", "n[a-b]", "n[[1]]", "n[1],,m"}) {
    try {
      expand(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("SLURM_JOB_NODELIST='" + bad + "'"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(expand("n[0-99999999]"), ConfigError);  // over a million hosts
}

TEST(JobPort, SameForEveryNodeOfAJobBelowTheEphemeralRange) {
  EXPECT_EQ(clusterJobPort(0), 20000);
  EXPECT_EQ(clusterJobPort(123456), 23456);
  EXPECT_EQ(clusterJobPort(1989214209ULL), 24209);  // an Open MPI job id
  for (unsigned long long id : {1ULL, 9999ULL, 10000ULL, 18446744073709551615ULL}) {
    EXPECT_GE(clusterJobPort(id), 20000);
    EXPECT_LT(clusterJobPort(id), 30000);
  }
  // Each step of a job its own port: two srun steps running at once met at one store (a review
  // under a real Slurm: one step's rank joined the other's job). 20000 + (job + 1009 step) % 10000.
  EXPECT_EQ(clusterJobPort(123456, 1), 20000 + (3456 + 1009) % 10000);
  EXPECT_EQ(clusterJobPort(123456, 9), 20000 + (3456 + 9081) % 10000);
  std::set<int> ports;
  for (unsigned long long step = 0; step < 100; ++step) ports.insert(clusterJobPort(123456, step));
  EXPECT_EQ(ports.size(), 100u);
  EXPECT_EQ(slurmStepNumber("3"), 3u);
  EXPECT_EQ(slurmStepNumber("4294967294"), 0u);  // the batch script's step
  EXPECT_EQ(slurmStepNumber(""), 0u);
  EXPECT_EQ(slurmStepNumber("batch"), 0u);
}

}  // namespace
}  // namespace ddp
