// What the worker e2e tests share about models and corpora: char-level token shards of the
// project's own docs (real English text, always at hand) and the largest difference between two
// state dicts (two exports, keys compared).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
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

/// The loss of the GPT export `modelPath` in the Python reference (tests/python/gpt_reference.py,
/// after nanoGPT's model.py; loaded with strict=True on the CPU, fp32) on the first `windows`
/// windows of `block` + 1 tokens, `block` apart, of the llm.c shard `valShard`; `modelArgs` is the
/// rest of its config ("n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=93"). NaN, with a
/// failure, if the script fails.
inline double referenceGptLoss(const std::string& modelPath, const std::string& valShard, const std::string& modelArgs,
                               int64_t block, int64_t windows) {
  const std::string b = std::to_string(block);
  const std::string script =
      "import array, json, sys, torch\n"
      "sys.path.insert(0, '" + std::string(DDP_SOURCE_DIR) + "/tests/python')\n"
      "from gpt_reference import Gpt\n"
      "m = Gpt(dict(" + modelArgs + ", dropout=0.0, bias=True))\n"
      "m.load_state_dict(torch.load('" + modelPath + "', map_location='cpu'), strict=True); m.eval()\n"
      // llm.c's shard: a 256 x int32 header, then uint16 tokens (read with array: no numpy needed).
      "a = array.array('H'); a.frombytes(open('" + valShard + "', 'rb').read()[1024:])\n"
      "t = torch.tensor(a, dtype=torch.int64)\n"
      "w = torch.stack([t[i * " + b + ":i * " + b + " + " + b + " + 1] for i in range(" + std::to_string(windows) + ")])\n"
      "with torch.no_grad(): logits, loss = m(w[:, :-1], w[:, 1:])\n"
      "print(json.dumps({'loss': loss.item()}))\n";
  const auto py = runCommand({DDP_PYTHON, "-c", script}, stdoutOnly());
  if (py.exitCode != 0) {
    ADD_FAILURE() << py.output;
    return std::nan("");
  }
  return nlohmann::json::parse(py.output)["loss"].get<double>();
}

/// maxStateDifference of the model.pt two jobs exported into their output dirs.
inline double maxExportDifference(const std::string& outA, const std::string& outB) {
  return maxStateDifference(loadTensors(outA + "/model.pt"), loadTensors(outB + "/model.pt"));
}

/// The parameters each of a job's `ranks` ranks dumped (rank<r>_params.pt in its output dir,
/// train.dump_params) equal, bit for bit, another job's: one failure per tensor that differs or is
/// missing (exact resume, ZeRO vs plain: the same training, so the same bits on every rank).
inline void expectRankParamsBitwiseEqual(const std::string& outA, const std::string& outB, int ranks) {
  for (int r = 0; r < ranks; ++r) {
    const std::string file = "/rank" + std::to_string(r) + "_params.pt";
    const StateDict a = loadTensors(outA + file);
    const StateDict b = loadTensors(outB + file);
    EXPECT_EQ(a.size(), b.size()) << "rank " << r;
    for (const auto& [key, value] : a) {
      const auto it = b.find(key);
      if (it == b.end()) {
        ADD_FAILURE() << "rank " << r << " " << key << " missing in " << outB << file;
        continue;
      }
      EXPECT_TRUE(at::equal(value, it->second)) << "rank " << r << " " << key;
    }
  }
}

}  // namespace ddp::test
