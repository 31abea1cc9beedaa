// Issue 43 through the real programs: data.name image_folder streamed (data.stream) — JPEGs made from
// Fashion-MNIST by bench/images/make_images.py, read and decoded per batch with torchvision's ImageNet
// recipe. The streamed path equals the in-memory one where both only resize; tar shards written in
// torchvision ImageFolder's own order equal the folder; a resume mid-epoch (with another loader
// thread count) is bitwise; a bad image ends the job naming the file, or is left out and counted.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "ddp/state_dict.h"
#include "tests/support/e2e_models.h"
#include "tests/support/run_command.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

std::string setRoot;  // removed when the program exits

// 48 training and 16 evaluation pictures (ImageFolder layout, train/ and val/), the same as tar
// shards of 20 in ImageFolder's order, a copy of the folder with one training JPEG truncated, and
// 24 + 10 pictures of 32 x 32.
const std::string& imageSet() {
  static const std::string dir = [] {
    setRoot = test::makeTempDir("streamed_images");
    std::atexit([] { fs::remove_all(setRoot); });
    const std::string py = DDP_PYTHON;
    auto r = test::runCommand({py, std::string(DDP_SOURCE_DIR) + "/bench/images/make_images.py", "--out", setRoot,
                               "--train", "48", "--val", "16", "--layout", "folder", "--jobs", "1"},
                              300);
    EXPECT_EQ(r.exitCode, 0) << r.output;
    for (const char* split : {"train", "val"}) {
      r = test::runCommand({py, std::string(DDP_SOURCE_DIR) + "/tests/python/image_folder_to_shards.py",
                            setRoot + "/folder/" + split, setRoot + "/" + split, "20"},
                           120);
      EXPECT_EQ(r.exitCode, 0) << r.output;
    }
    fs::copy(setRoot + "/folder", setRoot + "/broken", fs::copy_options::recursive);
    // Pictures of the network's input size, which neither path resamples.
    r = test::runCommand({py, std::string(DDP_SOURCE_DIR) + "/bench/images/make_images.py", "--out",
                          setRoot + "/small", "--train", "24", "--val", "10", "--layout", "folder", "--jobs", "1",
                          "--size", "32x32"},
                         300);
    EXPECT_EQ(r.exitCode, 0) << r.output;
    return setRoot;
  }();
  return dir;
}

// The first training JPEG of the broken copy, cut to half its bytes.
std::string truncatedImage() {
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(imageSet() + "/broken/train")) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  const fs::path victim = files.front();
  static const bool cut = [&] {
    fs::resize_file(victim, fs::file_size(victim) / 2);
    return true;
  }();
  (void)cut;
  return victim.string();
}

std::vector<std::string> imageJob(int nproc, const std::string& out, std::vector<std::string> extra) {
  std::vector<std::string> argv = {DDP_LAUNCH_BIN, "--nproc_per_node=" + std::to_string(nproc), DDP_WORKER_BIN,
                                   std::string(DDP_SOURCE_DIR) + "/configs/fmnist_cnn_ddp.yaml",
                                   "data.name=image_folder", "data.root=" + imageSet() + "/folder",
                                   "data.image_size=32", "train.batch_size=4", "train.epochs=1",
                                   "train.log_every=1", "output.dir=" + out};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

nlohmann::json summaryOf(const std::string& out) { return nlohmann::json::parse(test::readFile(out + "/summary.json")); }


TEST(StreamedImages, TrainWithTheImageNetRecipeAndSayTheyStreamed) {
  const std::string out = test::makeTempDir("streamed_run");
  const auto r = test::runCommand(imageJob(2, out, {"data.train_transform=imagenet"}), 300);
  ASSERT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("streaming the images: data.train_transform: imagenet"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(48 train / 16 test images, streamed)"), std::string::npos) << r.output;
  const auto s = summaryOf(out);
  EXPECT_EQ(s["data_streamed"], true);
  EXPECT_EQ(s["skipped_images"], 0);
  EXPECT_EQ(s["steps"], 6);  // 48 images / (2 ranks x 4)
  EXPECT_EQ(s["test_total"], 16);  // val/ when there is no test/
  // The normalisation the recipe used, in the resolved config (it said `mean: []`).
  const std::string resolved = test::readFile(out + "/config.resolved.yaml");
  EXPECT_NE(resolved.find("mean: [0.485, 0.456, 0.406]"), std::string::npos) << resolved;
  EXPECT_NE(resolved.find("std: [0.229, 0.224, 0.225]"), std::string::npos) << resolved;
  fs::remove_all(out);
}

// 32 x 32 pictures, 32 x 32 input: both paths decode (the in-memory one at start-up, the streamed one
// per batch), normalise and batch the same samples in the same order: the same weights. (Where they
// resize they may differ by a rounding: in memory the images are resized as torchvision's Resize on
// tensors, streamed as on PIL images, which a torchvision ImageFolder pipeline does.)
TEST(StreamedImages, EqualTheInMemoryPathOnTheSamePictures) {
  const std::string streamed = test::makeTempDir("streamed_resize");
  const std::string memory = test::makeTempDir("memory_resize");
  const std::string small = "data.root=" + imageSet() + "/small/folder";
  const auto a = test::runCommand(imageJob(2, streamed, {small, "data.stream=true"}), 300);
  ASSERT_EQ(a.exitCode, 0) << a.output;
  const auto b = test::runCommand(imageJob(2, memory, {small, "data.stream=false"}), 300);
  ASSERT_EQ(b.exitCode, 0) << b.output;
  EXPECT_EQ(summaryOf(streamed)["data_streamed"], true);
  EXPECT_EQ(summaryOf(memory).count("data_streamed"), 0u);
  EXPECT_EQ(test::maxExportDifference(streamed, memory), 0.0);
  // The first 20 training pictures only, rotated, cropped from a padding and flipped: the streamed
  // path augments with the in-memory path's draws (both ignored data.train_limit and the
  // augmentation keys when streaming before: the weights differed).
  const std::vector<std::string> limitedAndAugmented = {small, "data.train_limit=20", "data.rotate_degrees=10",
                                                        "data.crop_padding=2", "data.horizontal_flip=true"};
  auto streamedArgs = limitedAndAugmented, memoryArgs = limitedAndAugmented;
  streamedArgs.push_back("data.stream=true");
  memoryArgs.push_back("data.stream=false");
  const auto c = test::runCommand(imageJob(2, streamed, streamedArgs), 300);
  ASSERT_EQ(c.exitCode, 0) << c.output;
  EXPECT_NE(c.output.find("(20 train / 10 test images, streamed)"), std::string::npos) << c.output;
  const auto d = test::runCommand(imageJob(2, memory, memoryArgs), 300);
  ASSERT_EQ(d.exitCode, 0) << d.output;
  EXPECT_EQ(summaryOf(streamed)["steps"], 3);  // DistributedSampler: 10 pictures per rank, batches of 4, 4, 2
  EXPECT_EQ(summaryOf(streamed)["steps"], summaryOf(memory)["steps"]);
  EXPECT_EQ(test::maxExportDifference(streamed, memory), 0.0);
  fs::remove_all(streamed);
  fs::remove_all(memory);
}

// Decoded into memory, a set costs its kept (resized) images, not every picture at full size at once:
// 240 more pictures of ~400 x 350 (~100 MB decoded whole, ~0.2 MB kept at 16 x 16) raise the peak by
// far less than their full size (they were all decoded before any was resized: +100 MB).
TEST(StreamedImages, DecodedIntoMemoryTheSetCostsItsKeptSize) {
  const std::string many = test::makeTempDir("memory_many");
  const auto made = test::runCommand({DDP_PYTHON, std::string(DDP_SOURCE_DIR) + "/bench/images/make_images.py", "--out",
                                      many + "/set", "--train", "288", "--val", "10", "--layout", "folder", "--jobs",
                                      "2"},
                                     300);
  ASSERT_EQ(made.exitCode, 0) << made.output;
  auto peakOf = [&](const std::string& root, const std::string& out) {
    const auto run = test::runCommand(imageJob(1, out, {"data.root=" + root, "data.stream=false", "data.image_size=16",
                                                        "data.num_workers=2", "train.max_steps=1", "eval.enabled=false"}),
                                      300);
    EXPECT_EQ(run.exitCode, 0) << run.output;
    return run.exitCode == 0 ? summaryOf(out)["peak_rss_mb"].get<double>() : 0.0;
  };
  const double few = peakOf(imageSet() + "/folder", many + "/few_out");  // 48 + 16 pictures
  const double lots = peakOf(many + "/set/folder", many + "/many_out");  // 288 + 10
  ASSERT_GT(few, 0.0);
  ASSERT_GT(lots, 0.0);
  EXPECT_LT(lots - few, 40.0) << "peak RSS " << few << " MB with 64 pictures, " << lots << " MB with 298";
  fs::remove_all(many);
}

// mode eval reads the evaluation split only: a root with val/ alone (the classes its folders, as
// torchvision's ImageFolder(root/val) maps them) evaluates the trained model as the training run's
// own evaluation did, decoded into memory or streamed (it needed train/ before, and decoded it).
TEST(StreamedImages, ModeEvalNeedsOnlyTheEvaluationSplit) {
  const std::string trained = test::makeTempDir("eval_only_trained");
  const auto t = test::runCommand(imageJob(1, trained, {"data.root=" + imageSet() + "/small/folder", "data.stream=false"}), 300);
  ASSERT_EQ(t.exitCode, 0) << t.output;
  const std::string root = test::makeTempDir("eval_only_root");
  fs::copy(imageSet() + "/small/folder/val", root + "/val", fs::copy_options::recursive);
  for (const char* stream : {"false", "true"}) {
    const std::string out = test::makeTempDir("eval_only_out");
    const auto r = test::runCommand(imageJob(1, out, {"data.root=" + root, std::string("data.stream=") + stream,
                                                      "mode=eval", "eval.model_path=" + trained + "/model.pt"}),
                                    300);
    ASSERT_EQ(r.exitCode, 0) << "data.stream=" << stream << "\n" << r.output;
    const auto e = nlohmann::json::parse(test::readFile(out + "/eval.json"));
    EXPECT_EQ(e["test_total"], 10) << stream;
    EXPECT_EQ(e["test_correct"], summaryOf(trained)["test_correct"]) << stream;
    fs::remove_all(out);
  }
  fs::remove_all(root);
  fs::remove_all(trained);
}

// eval.enabled false reads the training split only: a root with train/ alone trains, decoded into
// memory (one copy per host, its evaluation split empty) or streamed, to the same weights; tar
// shards need no data.val_files. With evaluation on, the missing val/ is one line, exit 2. (It
// demanded val/ or test/ whatever eval.enabled said, and decoded it.)
TEST(StreamedImages, TrainingWithEvalOffNeedsNoEvaluationSplit) {
  const std::string root = test::makeTempDir("train_only_root");
  fs::copy(imageSet() + "/small/folder/train", root + "/train", fs::copy_options::recursive);
  const std::string streamed = test::makeTempDir("train_only_streamed");
  const std::string memory = test::makeTempDir("train_only_memory");
  const auto refused = test::runCommand(imageJob(1, memory, {"data.root=" + root}), 120);
  EXPECT_EQ(refused.exitCode, 1) << refused.output;  // data.root's folder is data
  EXPECT_NE(refused.output.find("' has no val/ (or test/) folder of <class>/ folders for evaluation"),
            std::string::npos) << refused.output;
  for (const auto& [out, stream] : {std::pair{streamed, "true"}, std::pair{memory, "false"}}) {
    const auto r = test::runCommand(imageJob(2, out, {"data.root=" + root, std::string("data.stream=") + stream,
                                                      "eval.enabled=false"}),
                                    300);
    ASSERT_EQ(r.exitCode, 0) << "data.stream=" << stream << "\n" << r.output;
    const auto s = summaryOf(out);
    EXPECT_EQ(s["steps"], 3) << stream;  // 24 pictures / (2 ranks x 4)
    EXPECT_EQ(s.count("test_total"), 0u) << stream;
  }
  EXPECT_EQ(test::maxExportDifference(streamed, memory), 0.0);
  const auto shards = test::runCommand(imageJob(1, streamed, {"data.train_files=" + imageSet() + "/train-*.tar",
                                                               "eval.enabled=false"}),
                                       300);
  ASSERT_EQ(shards.exitCode, 0) << shards.output;
  EXPECT_EQ(summaryOf(streamed)["steps"], 12);  // 48 pictures / 4
  for (const auto& dir : {root, streamed, memory}) fs::remove_all(dir);
}

TEST(StreamedImages, TarShardsInImageFolderOrderEqualTheFolder) {
  const std::string folder = test::makeTempDir("streamed_folder");
  const std::string shards = test::makeTempDir("streamed_shards");
  const auto a = test::runCommand(imageJob(2, folder, {"data.train_transform=imagenet"}), 300);
  ASSERT_EQ(a.exitCode, 0) << a.output;
  const auto b = test::runCommand(imageJob(2, shards, {"data.train_transform=imagenet",
                                                       "data.train_files=" + imageSet() + "/train-*.tar",
                                                       "data.val_files=" + imageSet() + "/val-*.tar"}),
                                  300);
  ASSERT_EQ(b.exitCode, 0) << b.output;
  EXPECT_EQ(test::maxExportDifference(folder, shards), 0.0);
  EXPECT_EQ(summaryOf(folder)["test_accuracy"], summaryOf(shards)["test_accuracy"]);
  fs::remove_all(folder);
  fs::remove_all(shards);
}

// 6 steps at once (no loader threads) equal 3, a checkpoint, and 3 more after resume=auto with two
// loader threads: the crops depend on (seed, epoch, sample) only.
TEST(StreamedImages, ResumeMidEpochIsBitwiseWithAnotherThreadCount) {
  const std::string straight = test::makeTempDir("streamed_straight");
  const std::string split = test::makeTempDir("streamed_split");
  const std::vector<std::string> recipe = {"data.train_transform=imagenet", "checkpoint.every_steps=3"};
  auto all = recipe;
  all.push_back("data.num_workers=0");
  const auto r = test::runCommand(imageJob(2, straight, all), 300);
  ASSERT_EQ(r.exitCode, 0) << r.output;
  auto first = recipe;
  first.push_back("train.max_steps=3");
  const auto r1 = test::runCommand(imageJob(2, split, first), 300);
  ASSERT_EQ(r1.exitCode, 0) << r1.output;
  auto second = recipe;
  second.push_back("resume=auto");
  second.push_back("data.num_workers=2");
  const auto r2 = test::runCommand(imageJob(2, split, second), 300);
  ASSERT_EQ(r2.exitCode, 0) << r2.output;
  EXPECT_EQ(summaryOf(split)["steps"], 6);
  EXPECT_EQ(test::maxExportDifference(straight, split), 0.0);
  fs::remove_all(straight);
  fs::remove_all(split);
}

TEST(StreamedImages, ABadImageEndsTheJobWithOneLineNamingIt) {
  const std::string bad = truncatedImage();
  const std::string out = test::makeTempDir("streamed_bad");
  const auto r = test::runCommand(
      imageJob(2, out, {"data.root=" + imageSet() + "/broken", "data.train_transform=imagenet"}), 300);
  EXPECT_EQ(r.exitCode, 1) << r.output;
  EXPECT_NE(r.output.find(bad), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out + "/model.pt"));
  fs::remove_all(out);
}

TEST(StreamedImages, SkipBadImagesLeavesItOutAndCountsIt) {
  const std::string bad = truncatedImage();
  const std::string out = test::makeTempDir("streamed_skip");
  // data.stream auto: skipping bad images streams (decoding the set up front stopped at the first,
  // the request dropped), whatever the transform.
  const auto r = test::runCommand(imageJob(2, out, {"data.root=" + imageSet() + "/broken", "data.skip_bad_images=true",
                                                    "train.epochs=2"}),
                                  300);
  ASSERT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("streaming the images: data.skip_bad_images"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(bad), std::string::npos) << "the skipped file is logged\n" << r.output;
  const auto s = summaryOf(out);
  EXPECT_EQ(s["skipped_images"], 2) << "once per epoch";
  EXPECT_EQ(s["samples"], 2 * 48) << "the sampler's positions, the skipped ones included";
  fs::remove_all(out);
}

TEST(StreamedImages, SettingsThatDoNotFitAreOneLineExitTwo) {
  const std::string out = test::makeTempDir("streamed_misuse");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"data.stream=false", "data.train_transform=imagenet"},
       "config: 'data.train_transform' is imagenet, which crops every image anew each epoch from the file: it needs "
       "data.stream: auto or true"},
      {{"data.stream=true", "data.image_size=0"}, "config: 'data.image_size' is needed with data.stream: true"},
      {{"data.stream=maybe"}, "config: 'data.stream' is 'maybe'; use auto"},
      // Skipping bad images streams them, and a stream needs the size to resize them to.
      {{"data.skip_bad_images=true", "data.image_size=0"},
       "config: 'data.skip_bad_images' leaves bad images out as a stream meets them, and a stream resizes each image "
       "to data.image_size, which is 0"},
      // A glob that matches nothing is the key's mistake, as for token shards (it was exit 1 without the key).
      {{"data.train_files=no_such_dir/train-*.tar"},
       "config: 'data.train_files' matches no file: 'no_such_dir/train-*.tar' (relative to the working directory "},
      {{"data.train_files=" + imageSet() + "/train-*.tar", "data.val_files=" + imageSet() + "/nothing-*.tar"},
       "config: 'data.val_files' matches no file: '" + imageSet() + "/nothing-*.tar'; give a glob"},
  };
  for (const auto& [settings, line] : cases) {
    const auto r = test::runCommand(imageJob(1, out, settings), 120);
    EXPECT_EQ(r.exitCode, 2) << r.output;
    EXPECT_NE(r.output.find(line), std::string::npos) << r.output;
  }
  fs::remove_all(out);
}

}  // namespace
}  // namespace ddp
