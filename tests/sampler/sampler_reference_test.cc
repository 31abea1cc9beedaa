// DistributedSampler against PyTorch itself: tests/python/sampler_reference.py
// prints what torch.utils.data.distributed.DistributedSampler yields for a grid
// of cases, and every rank's list must match exactly.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>
#include <string>

#include "sampler/distributed_sampler.h"
#include "tests/support/run_command.h"

namespace ddp::sampler {
namespace {

TEST(SamplerReference, MatchesPyTorchDistributedSampler) {
  const auto reference =
      test::runCommand({DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/sampler_reference.py"}, test::stdoutOnly());
  EXPECT_EQ(reference.exitCode, 0) << "sampler_reference.py failed; is Debian's python3-torch installed for "
                                   << DDP_PYTHON << "?";
  const std::string& out = reference.output;
  ASSERT_FALSE(out.empty());
  const auto ref = nlohmann::json::parse(out);
  const auto& cases = ref.at("cases");
  ASSERT_GT(cases.size(), 100u);
  RecordProperty("python_torch_version", ref.at("torch_version").get<std::string>());

  size_t checkedRanks = 0;
  for (const auto& c : cases) {
    const int64_t n = c.at("n");
    DistributedSamplerOptions options;
    options.numReplicas = c.at("world");
    options.shuffle = c.at("shuffle");
    options.seed = c.at("seed");
    options.dropLast = c.at("drop_last");
    const int64_t epoch = c.at("epoch");
    const auto& ranks = c.at("ranks");
    ASSERT_EQ(static_cast<int64_t>(ranks.size()), options.numReplicas);
    for (options.rank = 0; options.rank < options.numReplicas; ++options.rank) {
      DistributedSampler sampler(n, options);
      sampler.setEpoch(epoch);
      const std::string where = c.dump().substr(0, 120) + "... rank " +
                                std::to_string(options.rank);
      EXPECT_EQ(sampler.numSamples(), c.at("num_samples").get<int64_t>()) << where;
      EXPECT_EQ(sampler.totalSize(), c.at("total_size").get<int64_t>()) << where;
      EXPECT_EQ(sampler.indices(), ranks.at(options.rank).get<std::vector<int64_t>>()) << where;
      ++checkedRanks;
    }
  }
  RecordProperty("checked_ranks", static_cast<int>(checkedRanks));
}

}  // namespace
}  // namespace ddp::sampler
