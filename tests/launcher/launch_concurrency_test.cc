// Runs several ddp-launch jobs at once on this host: each picks its own free MASTER_PORT,
// so rank 0 of every job can listen (without SO_REUSEADDR) and its peers reach it.
#include <memory>
#include <regex>
#include <set>

#include <gtest/gtest.h>

#include "tests/launcher/launched_process.h"
#include "tests/launcher/scratch_dir.h"

namespace ddp::launcher::testing {
namespace {

using std::chrono::seconds;

TEST(LaunchConcurrency, SimultaneousLaunchesGetDistinctPortsAndAllSucceed) {
  becomeSubreaper();
  constexpr int kLaunches = 4;
  ScratchDir dir;
  std::vector<std::unique_ptr<LaunchedProcess>> launches;
  for (int i = 0; i < kLaunches; ++i) {
    LaunchSpec spec;
    spec.args = {"--nproc_per_node=2", DDP_RENDEZVOUS_PROBE};
    spec.outputDir = dir.path();
    spec.name = "launch" + std::to_string(i);
    launches.push_back(std::make_unique<LaunchedProcess>(spec));
  }
  std::set<std::string> ports;
  const std::regex listening(R"(\[rank 0\] listening on 127\.0\.0\.1:(\d+))");
  for (int i = 0; i < kLaunches; ++i) {
    SCOPED_TRACE("launch " + std::to_string(i));
    EXPECT_EQ(launches[i]->waitFor(seconds(30)), 0) << launches[i]->stderrText();
    std::smatch match;
    const std::string out = launches[i]->stdoutText();
    ASSERT_TRUE(std::regex_search(out, match, listening)) << out;
    ports.insert(match[1]);
  }
  EXPECT_EQ(ports.size(), size_t{kLaunches});
}

}  // namespace
}  // namespace ddp::launcher::testing
