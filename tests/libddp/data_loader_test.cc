// ddp::DataLoaderSampler under LibTorch's own loader (torch::data::make_data_loader, worker threads)
// against PyTorch's DataLoader(sampler=DistributedSampler(...)): tests/python/data_loader_reference.py
// prints every rank's batches per epoch, and the C++ loader must yield the same ones in the same order.
#include <ddp/data_loader.h>
#include <ddp/sampler.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/run_command.h"

namespace {

// Item i is i: a batch is the list of indices the sampler chose.
struct Indices : torch::data::datasets::Dataset<Indices, int64_t> {
  explicit Indices(size_t n) : n(n) {}
  int64_t get(size_t index) override { return static_cast<int64_t>(index); }
  torch::optional<size_t> size() const override { return n; }
  size_t n;
};

// The forgotten set_epoch with ddp::DistributedSampler: a second batches() without setEpoch in
// between repeats the last pass's order (as PyTorch's would, silently): one warning, once; none
// with setEpoch between passes, through epochBatches, or without shuffling (the order never changes).
TEST(DistributedSamplerPasses, ASecondPassWithoutSetEpochWarnsOnce) {
  auto warningsOf = [](const std::function<void()>& passes) {
    const auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(16);
    spdlog::default_logger()->sinks().push_back(sink);
    passes();
    spdlog::default_logger()->sinks().pop_back();
    int count = 0;
    for (const std::string& line : sink->last_formatted()) {
      count += line.find("batches() again without setEpoch, so this pass sees the same order") != std::string::npos;
    }
    return count;
  };
  ddp::DistributedSampler forgot(100, 2, 0);
  EXPECT_EQ(warningsOf([&] {
              for (int epoch = 0; epoch < 3; ++epoch) forgot.batches(10);
            }),
            1);
  ddp::DistributedSampler remembered(100, 2, 0);
  EXPECT_EQ(warningsOf([&] {
              for (int epoch = 0; epoch < 3; ++epoch) {
                remembered.setEpoch(epoch);
                remembered.batches(10);
              }
              for (int epoch = 3; epoch < 5; ++epoch) remembered.epochBatches(epoch, 10);
            }),
            0);
  ddp::DistributedSampler ordered(100, 2, 0, ddp::SamplerOptions{/*shuffle=*/false});
  EXPECT_EQ(warningsOf([&] {
              ordered.batches(10);
              ordered.batches(10);
            }),
            0);
}

TEST(DataLoaderSampler, MakeDataLoaderYieldsPyTorchsBatchesEpochByEpoch) {
  const auto reference =
      ddp::test::runCommand({DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/data_loader_reference.py"}, ddp::test::stdoutOnly());
  EXPECT_EQ(reference.exitCode, 0) << "data_loader_reference.py";
  const std::string& out = reference.output;
  ASSERT_FALSE(out.empty());
  const auto ref = nlohmann::json::parse(out);
  RecordProperty("python_torch_version", ref.at("torch_version").get<std::string>());
  size_t checked = 0;
  for (const auto& c : ref.at("cases")) {
    ddp::SamplerOptions options;
    options.shuffle = c.at("shuffle");
    options.seed = c.at("seed");
    options.dropLast = c.at("drop_last");
    const int64_t n = c.at("n");
    ddp::DataLoaderSampler sampler(n, c.at("world").get<int>(), c.at("rank").get<int>(), options);
    // The loader takes a copy; setEpoch on ours must reach it.
    auto loader = torch::data::make_data_loader(Indices(n), sampler,
                                                torch::data::DataLoaderOptions(c.at("batch_size")).workers(2));
    const auto& epochs = c.at("epochs");
    for (size_t epoch = 0; epoch < epochs.size(); ++epoch) {
      sampler.setEpoch(static_cast<int64_t>(epoch));
      std::vector<std::vector<int64_t>> got;
      for (auto& batch : *loader) got.push_back(batch);
      const auto expected = epochs[epoch].get<std::vector<std::vector<int64_t>>>();
      EXPECT_EQ(got, expected) << c.dump().substr(0, 160) << " epoch " << epoch;
      ++checked;
    }
  }
  EXPECT_GT(checked, 100u);
}

TEST(DataLoaderSampler, CopiesShareTheEpochAndPosition) {
  ddp::DataLoaderSampler a(20, 2, 1, {true, 3});
  ddp::DataLoaderSampler b = a;
  b.setEpoch(4);
  EXPECT_EQ(a.epoch(), 4);
  a.reset();
  ASSERT_TRUE(b.next(3).has_value());
  EXPECT_EQ(a.position(), 3);
  EXPECT_EQ(a.numSamples(), 10);
}

// The loader's archive: a sampler loaded from a save in the middle of an epoch hands out the rest of
// that epoch's order, as the one that was saved would have.
TEST(DataLoaderSampler, SaveAndLoadResumeInTheMiddleOfAnEpoch) {
  ddp::DataLoaderSampler saved(37, 3, 2, {true, 11});
  saved.setEpoch(2);
  saved.reset();
  saved.next(4);
  saved.next(4);
  std::stringstream bytes;
  {
    torch::serialize::OutputArchive archive;
    saved.save(archive);
    archive.save_to(bytes);
  }
  ddp::DataLoaderSampler loaded(37, 3, 2, {true, 11});
  torch::serialize::InputArchive archive;
  archive.load_from(bytes);
  loaded.load(archive);
  EXPECT_EQ(loaded.epoch(), 2);
  EXPECT_EQ(loaded.position(), 8);
  for (auto expected = saved.next(5); expected.has_value(); expected = saved.next(5)) {
    EXPECT_EQ(loaded.next(5), expected);
  }
  EXPECT_FALSE(loaded.next(5).has_value());
  EXPECT_THROW(loaded.next(0), ddp::ConfigError);
}

// Resume through the loader: its begin() resets the sampler, and that first pass after load() must
// continue the saved epoch (indices 8.. of epoch 2's share), the next pass start epoch 3 afresh.
TEST(DataLoaderSampler, ALoaderStartedAfterLoadContinuesTheSavedEpoch) {
  const ddp::SamplerOptions options{true, 11};
  ddp::DataLoaderSampler reference(37, 3, 2, options);
  reference.setEpoch(2);
  reference.reset();
  const std::vector<size_t> share = *reference.next(1000);  // this rank's whole epoch-2 order
  ASSERT_EQ(share.size(), 13u);                              // ceil(37 / 3)

  ddp::DataLoaderSampler saved(37, 3, 2, options);
  saved.setEpoch(2);
  saved.reset();
  saved.next(8);
  std::stringstream bytes;
  {
    torch::serialize::OutputArchive archive;
    saved.save(archive);
    archive.save_to(bytes);
  }
  ddp::DataLoaderSampler loaded(37, 3, 2, options);
  torch::serialize::InputArchive archive;
  archive.load_from(bytes);
  loaded.load(archive);
  auto loader = torch::data::make_data_loader(Indices(37), loaded, torch::data::DataLoaderOptions(4).workers(2));
  std::vector<int64_t> got;
  for (auto& batch : *loader) got.insert(got.end(), batch.begin(), batch.end());
  EXPECT_EQ(got, std::vector<int64_t>(share.begin() + 8, share.end()));

  loaded.setEpoch(3);
  reference.setEpoch(3);
  reference.reset();
  const std::vector<size_t> next = *reference.next(1000);
  got.clear();
  for (auto& batch : *loader) got.insert(got.end(), batch.begin(), batch.end());
  EXPECT_EQ(got, std::vector<int64_t>(next.begin(), next.end()));
}

}  // namespace

// SamplerOptions::pad = false through the loader: no sample twice and none dropped, rank r holding
// ceil((N - r) / W) of them, which are the first ones of its padded (PyTorch's) share: padding only
// appends the permutation's head after position N.
TEST(DataLoaderSampler, PadFalseHandsOutEverySampleOnceInUnevenShares) {
  const int64_t n = 23;
  const int world = 3;
  for (const bool shuffle : {true, false}) {
    std::vector<int> seen(n, 0);
    for (int rank = 0; rank < world; ++rank) {
      ddp::SamplerOptions padded{shuffle, 5};
      ddp::SamplerOptions uneven = padded;
      uneven.pad = false;
      ddp::DataLoaderSampler reference(n, world, rank, padded);
      reference.setEpoch(1);
      reference.reset();
      const std::vector<size_t> full = *reference.next(1000);
      ASSERT_EQ(full.size(), 8u);  // ceil(23 / 3)
      const size_t share = static_cast<size_t>((n - rank + world - 1) / world);

      ddp::DataLoaderSampler sampler(n, world, rank, uneven);
      EXPECT_EQ(sampler.numSamples(), static_cast<int64_t>(share)) << "rank " << rank;
      auto loader = torch::data::make_data_loader(Indices(n), sampler, torch::data::DataLoaderOptions(3).workers(2));
      sampler.setEpoch(1);
      std::vector<int64_t> got;
      for (auto& batch : *loader) got.insert(got.end(), batch.begin(), batch.end());
      EXPECT_EQ(got, std::vector<int64_t>(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(share)))
          << "rank " << rank << " shuffle " << shuffle;
      for (const int64_t i : got) ++seen.at(static_cast<size_t>(i));
    }
    EXPECT_EQ(seen, std::vector<int>(n, 1)) << "shuffle " << shuffle;
  }
}
