// What the worker e2e tests share about models and corpora: char-level token shards of the
// project's own docs (real English text, always at hand) and the largest difference between two
// state dicts (two exports, keys compared).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "ddp/state_dict.h"
#include "tests/support/run_command.h"

namespace ddp::test {

/// scripts/prepare_text.py --level char on docs/*.md into a temp dir named after `tag`, made once
/// per test program and removed when it exits; returns the shards' directory.
inline const std::string& docsCharCorpus(const std::string& tag) {
  static std::string root;
  static const std::string dir = [&] {
    namespace fs = std::filesystem;
    root = makeTempDir(tag);
    std::atexit([] { fs::remove_all(root); });
    const std::string out = root + "/char";
    std::vector<std::string> argv = {DDP_PYTHON, std::string(DDP_SOURCE_DIR) + "/scripts/prepare_text.py"};
    std::vector<std::string> inputs;
    for (const auto& e : fs::directory_iterator(std::string(DDP_SOURCE_DIR) + "/docs")) {
      if (e.path().extension() == ".md") inputs.push_back(e.path().string());
    }
    std::sort(inputs.begin(), inputs.end());
    argv.insert(argv.end(), inputs.begin(), inputs.end());
    argv.insert(argv.end(), {"--out", out, "--level", "char"});
    const auto r = runCommand(argv, 120);
    EXPECT_EQ(r.exitCode, 0) << r.output;
    return out;
  }();
  return dir;
}

/// max |a[k] - b[k]| over the keys of `a`; a key `b` lacks, or a shape or dtype that differs, is a failure.
inline double maxStateDifference(const StateDict& a, const StateDict& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (const auto& [key, t] : a) {
    if (b.count(key) == 0) {
      ADD_FAILURE() << key << " missing";
      continue;
    }
    EXPECT_EQ(t.sizes(), b.at(key).sizes()) << key;
    EXPECT_EQ(t.scalar_type(), b.at(key).scalar_type()) << key;
    worst = std::max(worst, (t - b.at(key)).abs().max().item<double>());
  }
  return worst;
}

/// maxStateDifference of the model.pt two jobs exported into their output dirs.
inline double maxExportDifference(const std::string& outA, const std::string& outB) {
  return maxStateDifference(loadTensors(outA + "/model.pt"), loadTensors(outB + "/model.pt"));
}

}  // namespace ddp::test
