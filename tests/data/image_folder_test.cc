// data.name: image_folder — PNG (RGB, gray, palette, RGBA) and JPEG (RGB, gray) decoded to exactly
// the bytes Pillow's convert("RGB") gives, in ImageFolder's order with its labels; resize equal to
// torchvision's Resize on tensors. References come from tests/python/make_image_folder.py.
#include "worker/data/image_folder.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/error.h"
#include "worker/data/tensor_files.h"

namespace ddp::worker::data {
namespace {

namespace fs = std::filesystem;

class ImageFolder : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string((fs::temp_directory_path() / ("ddp_image_folder_" + std::to_string(::getpid()))).string());
    fs::create_directories(*dir_);
    const std::string command =
        std::string(DDP_PYTHON) + " -W ignore " DDP_SOURCE_DIR "/tests/python/make_image_folder.py " + *dir_;
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static std::string at(const std::string& rel) { return *dir_ + "/" + rel; }
  static std::string errorOf(const std::string& tree) {
    try {
      loadImageFolderSplit(ddp::ImageDataset::folder(at(tree + "/train")), {});
    } catch (const DataError& e) {
      return e.what();
    }
    return "<no DataError>";
  }
  static std::string* dir_;
};
std::string* ImageFolder::dir_ = nullptr;

TEST_F(ImageFolder, DecodesWhatPillowDecodesInImageFoldersOrder) {
  EXPECT_EQ(ddp::ImageDataset::folder(at("good/train")).classes(), (std::vector<std::string>{"ant", "bee", "cat"}));
  for (const std::string split : {"train", "test"}) {
    for (int threads : {1, 3}) {
      ImageFolderOptions o;
      o.threads = threads;
      const TensorDataset ours = loadImageFolderSplit(ddp::ImageDataset::folder(at("good/" + split)), o);
      const TensorDataset pillow = loadTensorFile(at("good_reference_" + split + ".pt"), "reference");
      ASSERT_EQ(ours.images.sizes(), pillow.images.sizes()) << split;
      EXPECT_TRUE(ours.labels.equal(pillow.labels)) << split;
      for (int64_t i = 0; i < ours.size(); ++i) {
        EXPECT_TRUE(ours.images[i].equal(pillow.images[i])) << split << " image " << i << " (" << threads << " threads)";
      }
    }
  }
}

TEST_F(ImageFolder, ResizeIsTorchvisionsAntialiasedBilinear) {
  ImageFolderOptions o;
  o.resize = 8;
  const TensorDataset ours = loadImageFolderSplit(ddp::ImageDataset::folder(at("good/train")), o);
  const TensorDataset python = loadTensorFile(at("good_resized_train.pt"), "reference");
  ASSERT_EQ(ours.images.sizes(), python.images.sizes());
  // Same LibTorch kernel family; a float rounding tie may land on the other byte.
  const int64_t worst = ours.images.to(at::kInt).sub(python.images.to(at::kInt)).abs().max().item<int>();
  EXPECT_LE(worst, 1);
  EXPECT_GT(ours.images.eq(python.images).to(at::kDouble).mean().item<double>(), 0.99);
}

// Images at the top of a class folder come before its sub-folders', sub-folders in os.walk's
// order ('a/' before 'a.b/', where sorting whole paths puts 'a.b/z' first), and a linked folder's
// images are samples: torchvision's own make_dataset gives the reference.
TEST_F(ImageFolder, NestedAndLinkedFoldersInTorchvisionsOrder) {
  const TensorDataset ours = loadImageFolderSplit(ddp::ImageDataset::folder(at("nested/train")), {});
  const TensorDataset python = loadTensorFile(at("nested_reference.pt"), "reference");
  ASSERT_EQ(ours.images.sizes(), python.images.sizes());
  EXPECT_TRUE(ours.labels.equal(python.labels)) << ours.labels << python.labels;
  for (int64_t i = 0; i < ours.size(); ++i) EXPECT_TRUE(ours.images[i].equal(python.images[i])) << "image " << i;
}

TEST_F(ImageFolder, BadTreesAreOneLineNamingTheFile) {
  const std::string broken = errorOf("broken");
  EXPECT_NE(broken.find("zz.png"), std::string::npos) << broken;
  EXPECT_NE(broken.find("cannot decode PNG"), std::string::npos) << broken;
  const std::string empty = errorOf("empty");
  EXPECT_NE(empty.find("class folder '" + at("empty/train/dog") + "' has no .jpg/.jpeg/.png images"), std::string::npos)
      << empty;
  EXPECT_NE(errorOf("nowhere").find("is not a directory"), std::string::npos);
  for (const std::string tree : {"broken", "empty", "nowhere"}) {
    EXPECT_EQ(errorOf(tree).find('\n'), std::string::npos) << errorOf(tree);
  }
}

}  // namespace
}  // namespace ddp::worker::data
