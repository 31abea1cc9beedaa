// One copy of the data set per host (issue 13): README's 4-rank CNN job decodes Fashion-MNIST once,
// every other rank maps that copy, and no rank's peak RSS exceeds 350 MiB; the same job with
// data.one_copy_per_host=false loads four copies and gives the same model.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/run_command.h"

namespace ddp {
namespace {

constexpr double kTargetPeakRssMb = 350;  // per rank, issue 13

std::string dataRoot() {
  const char* root = std::getenv("DDP_FASHION_MNIST_ROOT");
  return root ? root : "/usr/share/datasets/fashion-mnist";
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

struct Job {
  test::CommandResult run;
  nlohmann::json summary;
};

Job fourRanks(const std::string& dir, const std::string& share) {
  Job job;
  job.run = test::runCommand({DDP_LAUNCH_BIN, "--nproc_per_node=4", DDP_WORKER_BIN,
                              std::string(DDP_SOURCE_DIR) + "/configs/fmnist_cnn_ddp.yaml",
                              "data.root=" + dataRoot(), "train.max_steps=40",
                              "data.one_copy_per_host=" + share, "output.dir=" + dir},
                             600);
  if (job.run.exitCode == 0) job.summary = nlohmann::json::parse(test::readFile(dir + "/summary.json"));
  return job;
}

TEST(OneCopyPerHost, FourRanksDecodeFashionMnistOnceAndStayUnder350MiB) {
  if (!std::filesystem::exists(dataRoot() + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Debian package dataset-fashion-mnist is not installed (scripts/setup.sh installs it)";
  }
  const std::string dir = test::makeTempDir("ddp_share");
  const Job shared = fourRanks(dir + "/shared", "true");
  ASSERT_EQ(shared.run.exitCode, 0) << shared.run.output;
  EXPECT_EQ(count(shared.run.output, "data: loaded once for this host into shared memory"), 1u) << shared.run.output;
  EXPECT_EQ(shared.summary["data_copies"], 1);
  for (const auto& mb : shared.summary["peak_rss_mb_per_process"]) {
    EXPECT_LE(mb.get<double>(), kTargetPeakRssMb) << shared.summary["peak_rss_mb_per_process"];
  }

  const Job own = fourRanks(dir + "/own", "false");
  ASSERT_EQ(own.run.exitCode, 0) << own.run.output;
  EXPECT_EQ(count(own.run.output, "data: loaded once"), 0u);
  EXPECT_EQ(own.summary["data_copies"], 4);
  // Same bytes in, same training: the copy changes where the data lives, nothing else.
  EXPECT_EQ(own.summary["final_loss"], shared.summary["final_loss"]);
  EXPECT_EQ(own.summary["test_correct"], shared.summary["test_correct"]);
  std::filesystem::remove_all(dir);
}

// Issue 10 item 2: loader threads and pinning change when batches are made, never what they hold.
TEST(Loading, ExportsAreBitIdenticalForZeroOneAndThreeLoaderThreadsPinnedOrNot) {
  if (!std::filesystem::exists(dataRoot() + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Debian package dataset-fashion-mnist is not installed (scripts/setup.sh installs it)";
  }
  const std::string dir = test::makeTempDir("ddp_loading");
  std::string reference;
  for (const auto& [workers, pin] : std::vector<std::pair<int, bool>>{{0, false}, {1, true}, {3, false}, {3, true}}) {
    const std::string out = dir + "/w" + std::to_string(workers) + (pin ? "p" : "");
    const auto run = test::runCommand(
        {DDP_LAUNCH_BIN, "--nproc_per_node=2", DDP_WORKER_BIN, std::string(DDP_SOURCE_DIR) + "/configs/fmnist_cnn_ddp.yaml",
         "data.root=" + dataRoot(), "train.max_steps=25", "eval.enabled=false",
         // Augmented, so the batches depend on (seed, epoch, sample) draws as well as the sampler.
         "data.rotate_degrees=10", "data.crop_padding=2", "data.horizontal_flip=true",
         "data.num_workers=" + std::to_string(workers), std::string("data.pin_memory=") + (pin ? "true" : "false"),
         "output.dir=" + out},
        600);
    ASSERT_EQ(run.exitCode, 0) << run.output;
    const std::string model = test::readFile(out + "/model.pt");
    ASSERT_GT(model.size(), 1000u);
    if (reference.empty()) {
      reference = model;
    } else {
      EXPECT_TRUE(model == reference) << workers << " loader threads, pin_memory " << pin
                                      << ": the export differs from data.num_workers=0";
    }
  }
  std::filesystem::remove_all(dir);
}

// Issue 11 item 4: data.name tensors trains on files Python wrote, through the same host copy.
TEST(TensorFiles, TwoRanksLearnFromTensorsPythonSaved) {
  const std::string dir = test::makeTempDir("ddp_tensors");
  ASSERT_EQ(std::system((std::string(DDP_PYTHON) + " " + DDP_SOURCE_DIR + "/tests/python/make_tensor_data.py " + dir).c_str()), 0);
  struct Case {
    std::string files;
    std::vector<std::string> model;  // model and training overrides
    double minAccuracy;
  };
  // A fixed linear map of 4x4 block means (chance: 25 % and 20 %): the CNN on 1x8x8 floats, a small
  // MLP on 3x8x8 bytes (model input x / 255).
  for (const Case& c : {Case{"float", {"model.name=cnn", "train.epochs=8"}, 0.6},
                        Case{"bytes", {"model.name=mlp", "model.hidden=[64]", "train.epochs=20"}, 0.5}}) {
    const std::string out = dir + "/" + c.files;
    std::vector<std::string> argv = {
        DDP_LAUNCH_BIN, "--nproc_per_node=2", DDP_WORKER_BIN, std::string(DDP_SOURCE_DIR) + "/configs/fmnist_cnn_ddp.yaml",
        "data.name=tensors", "data.train_file=" + dir + "/" + c.files + "_train.pt",
        "data.test_file=" + dir + "/" + c.files + "_test.pt", "train.batch_size=32", "output.dir=" + out};
    argv.insert(argv.end(), c.model.begin(), c.model.end());
    const auto run = test::runCommand(argv, 600);
    ASSERT_EQ(run.exitCode, 0) << run.output;
    const auto summary = nlohmann::json::parse(test::readFile(out + "/summary.json"));
    EXPECT_EQ(summary["test_total"], 256);
    EXPECT_EQ(summary["data_copies"], 1);
    EXPECT_GT(summary["test_accuracy"].get<double>(), c.minAccuracy) << c.files << ": " << summary.dump();
    EXPECT_NE(run.output.find("(1024 train / 256 test)"), std::string::npos) << run.output;
  }
  // A file whose x and y disagree: one line naming it, exit 1, on every rank, nothing written.
  const auto bad = test::runCommand(
      {DDP_LAUNCH_BIN, "--nproc_per_node=2", DDP_WORKER_BIN, std::string(DDP_SOURCE_DIR) + "/configs/fmnist_cnn_ddp.yaml",
       "data.name=tensors", "data.train_file=" + dir + "/mismatch.pt", "data.test_file=" + dir + "/float_test.pt",
       "output.dir=" + dir + "/bad"},
      120);
  EXPECT_EQ(bad.exitCode, 1) << bad.output;
  EXPECT_NE(bad.output.find("data.train_file '" + dir + "/mismatch.pt': x holds 10 samples but y holds 9 labels"),
            std::string::npos) << bad.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/bad/model.pt"));
  std::filesystem::remove_all(dir);
}

// Inputs of 1e20: every gradient is finite (the loss too), but their L2 norm overflows float32, and
// clip_grad_norm_ then scales them by 0. Clipped, the step is a non-finite one, not a step of zeros
// taken as if nothing happened (the run went on so to its end, exit 0); unclipped, the huge step is
// taken and the next one diverges.
TEST(TensorFiles, AClippedStepWhoseGradientNormOverflowsIsNonFinite) {
  const std::string dir = test::makeTempDir("ddp_huge_inputs");
  const std::string script =
      "import torch\n"
      "g = torch.Generator().manual_seed(0)\n"
      "x = torch.rand(64, 1, 8, 8, generator=g) * 1e20\n"
      "y = torch.randint(0, 4, (64,), generator=g)\n"
      "torch.save({'x': x, 'y': y}, '" + dir + "/train.pt')\n"
      "torch.save({'x': x[:16], 'y': y[:16]}, '" + dir + "/test.pt')\n";
  const auto made = test::runCommand({DDP_PYTHON, "-c", script}, 120);
  ASSERT_EQ(made.exitCode, 0) << made.output;
  const auto job = [&](const std::string& clip) {
    return test::runCommand({DDP_WORKER_BIN, std::string(DDP_SOURCE_DIR) + "/configs/fmnist_mlp_ddp.yaml", "mode=single",
                             "data.name=tensors", "data.train_file=" + dir + "/train.pt",
                             "data.test_file=" + dir + "/test.pt", "model.hidden=[16]", "train.batch_size=16",
                             "train.epochs=1", "train.clip_grad_norm=" + clip, "output.dir=" + dir + "/out" + clip},
                            120);
  };
  const auto clipped = job("1");
  EXPECT_EQ(clipped.exitCode, 1) << clipped.output;
  EXPECT_NE(clipped.output.find("training diverged: a gradient or their norm (train.clip_grad_norm) is NaN or infinite "
                                "at step 1 (epoch 1), so it was not applied"),
            std::string::npos)
      << clipped.output;
  const auto unclipped = job("0");
  EXPECT_EQ(unclipped.exitCode, 1) << unclipped.output;
  EXPECT_NE(unclipped.output.find("training diverged: a gradient is NaN or infinite at step 2 (epoch 1)"),
            std::string::npos)
      << unclipped.output;
  std::filesystem::remove_all(dir);
}

// Issue 11 item 4: data.name image_folder trains on PNG/JPEG folders Pillow wrote.
TEST(ImageFolder, TwoRanksLearnFromAnImageFolderTree) {
  const std::string dir = test::makeTempDir("ddp_images");
  ASSERT_EQ(std::system((std::string(DDP_PYTHON) + " -W ignore " + DDP_SOURCE_DIR + "/tests/python/make_image_folder.py " + dir).c_str()), 0);
  const std::string config = std::string(DDP_SOURCE_DIR) + "/configs/fmnist_cnn_ddp.yaml";
  const auto run = test::runCommand(
      {DDP_LAUNCH_BIN, "--nproc_per_node=2", DDP_WORKER_BIN, config, "data.name=image_folder", "data.root=" + dir + "/good",
       "data.image_size=8", "data.mean=[0.5,0.5,0.5]", "data.std=[0.25,0.25,0.25]", "model.name=cnn", "train.epochs=10",
       "train.batch_size=6", "data.horizontal_flip=true", "output.dir=" + dir + "/out"},
      600);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  const auto summary = nlohmann::json::parse(test::readFile(dir + "/out/summary.json"));
  EXPECT_EQ(summary["test_total"], 36);
  EXPECT_EQ(summary["data_copies"], 1);
  // One colour per class (gray images carry it as brightness): far above chance (33 %).
  EXPECT_GT(summary["test_accuracy"].get<double>(), 0.6) << summary.dump();
  EXPECT_NE(run.output.find("(36 train / 36 test)"), std::string::npos) << run.output;

  const auto mismatch = test::runCommand({DDP_LAUNCH_BIN, "--nproc_per_node=2", DDP_WORKER_BIN, config,
                                          "data.name=image_folder", "data.root=" + dir + "/mismatch",
                                          "output.dir=" + dir + "/bad"},
                                         120);
  EXPECT_EQ(mismatch.exitCode, 1) << mismatch.output;
  EXPECT_NE(mismatch.output.find("has classes [ant, bee, cat] but " + dir + "/mismatch/test has [ant, bee]"),
            std::string::npos) << mismatch.output;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ddp
