// Streamed images through libddp.so (<ddp/image_data.h>) against Pillow and torchvision
// (tests/python/image_reference.py): decoded bytes equal Pillow's convert("RGB") (and its draft()
// for DCT-scaled JPEGs), RandomResizedCrop's box equals torchvision's get_params fed the same
// uniforms, train and eval transforms equal torchvision's on PIL images (bytes, and Normalize's
// floats), every sample once per epoch over 2 and 3 ranks, 1 and 4 threads give the same batches,
// a resumed epoch the same crops, tar shards the same samples as the folder; bad files are one
// line naming them, or skipped and counted.
#include <ddp/error.h>
#include <ddp/image_data.h>
#include <ddp/sampler.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/run_command.h"

namespace {

namespace fs = std::filesystem;

constexpr uint64_t kSeed = 1234;
constexpr int64_t kEpoch = 3;
constexpr int64_t kSize = 24;  // small outputs: the images are 20..300 px
constexpr int kDraws = 41;     // get_params takes at most 40, the flip one more

std::vector<double> drawsOf(uint64_t seed, int64_t epoch, int64_t index) {
  ddp::SampleRandom random(seed, epoch, index);
  std::vector<double> d;
  for (int k = 0; k < kDraws; ++k) d.push_back(random.uniform());
  return d;
}

std::vector<uint8_t> readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<float> readFloats(const std::string& path) {
  const auto bytes = readBytes(path);
  std::vector<float> f(bytes.size() / sizeof(float));
  std::memcpy(f.data(), bytes.data(), f.size() * sizeof(float));
  return f;
}

// Row `row` of a [B, 3, S, S] uint8 batch back in HWC order, to compare with numpy's bytes.
std::vector<uint8_t> hwcOf(const at::Tensor& images, int64_t row) {
  const at::Tensor hwc = images[row].permute({1, 2, 0}).contiguous();
  const uint8_t* p = hwc.data_ptr<uint8_t>();
  return {p, p + hwc.numel()};
}

int maxDifference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return 1000;
  int worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(int(a[i]) - int(b[i])));
  return worst;
}

class ImageDataTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(ddp::test::makeTempDir("image_data"));
    const auto made = ddp::test::runCommand({DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/image_reference.py", "make", *dir_}, ddp::test::CommandOptions{});
    ASSERT_EQ(made.exitCode, 0) << made.output;
    folder_ = new std::shared_ptr<const ddp::ImageDataset>(
        std::make_shared<const ddp::ImageDataset>(ddp::ImageDataset::folder(*dir_ + "/folder")));
    const ddp::ImageDataset& data = **folder_;

    // One request for everything the tests compare.
    nlohmann::json request = {{"dir", *dir_}};
    for (int64_t i = 0; i < data.size(); ++i) {
      const std::string file = data.name(i);
      request["decode"].push_back({{"file", file}, {"out", out("decode", i)}, {"denom", 1}});
      request["train"].push_back(
          {{"file", file}, {"out", out("train", i)}, {"size", kSize}, {"draws", drawsOf(kSeed, kEpoch, i)}});
      request["eval"].push_back({{"file", file}, {"out", out("eval", i)}, {"float_out", out("evalf", i)},
                                 {"size", kSize}, {"resize", kSize * 8 / 7}, {"mean", {0.485, 0.456, 0.406}},
                                 {"std", {0.229, 0.224, 0.225}}});
    }
    // The DCT-scaled transforms, train and eval.
    for (int64_t i = 0; i < data.size(); ++i) {
      for (const char* kind : {"train", "eval"}) {
        request["dct"].push_back({{"file", data.name(i)}, {"out", out(std::string("dct") + kind, i)}, {"kind", kind},
                                  {"size", kSize}, {"resize", kSize * 8 / 7}, {"draws", drawsOf(kSeed, kEpoch, i)}});
      }
    }
    // DCT-scaled JPEG decodes against Pillow's draft at the same scale.
    for (int64_t i = 0; i < data.size(); ++i) {
      if (data.name(i).find(".png") != std::string::npos) continue;
      for (int denom : {2, 4, 8}) {
        request["scaled"].push_back({{"index", i}, {"denom", denom}});
        request["decode"].push_back({{"file", data.name(i)},
                                     {"out", out("scaled" + std::to_string(denom), i)},
                                     {"denom", denom}});
      }
    }
    // Decode-only PNGs beyond the folder (16-bit gray, 2-bit gray, 16-bit gray + alpha), last.
    for (const char* name : {"gray16.png", "gray2.png", "la16.png"}) {
      request["extra"].push_back(*dir_ + "/extra/" + name);
      request["decode"].push_back({{"file", *dir_ + "/extra/" + name}, {"out", *dir_ + "/extra/" + name + ".raw"}, {"denom", 1}});
    }
    // Crop geometry on many shapes, the extreme ones mostly falling back to the centre crop.
    const int64_t shapes[][2] = {{375, 500}, {500, 375}, {224, 224}, {10, 100}, {100, 10}, {33, 300},
                                 {1, 1},     {2, 3},     {480, 640}, {57, 61},  {300, 20}, {1000, 40}};
    int64_t k = 0;
    for (const auto& s : shapes) {
      for (int n = 0; n < 40; ++n, ++k) {
        request["crops"].push_back({{"height", s[0]}, {"width", s[1]}, {"draws", drawsOf(77, 5, k)}});
      }
    }
    request_ = new nlohmann::json(request);
    const std::string in = *dir_ + "/request.json";
    std::ofstream(in) << request.dump();
    ddp::test::CommandOptions options = ddp::test::stdoutOnly();
    options.stdinPath = in;
    const auto run = ddp::test::runCommand({DDP_PYTHON, DDP_SOURCE_DIR "/tests/python/image_reference.py", "answer"},
                                           options);
    ASSERT_EQ(run.exitCode, 0) << run.output;
    reply_ = new nlohmann::json(nlohmann::json::parse(run.output));
  }
  static void TearDownTestSuite() {
    std::error_code ignored;
    fs::remove_all(*dir_, ignored);
    delete dir_;
    delete folder_;
    delete request_;
    delete reply_;
  }

  static std::string out(const std::string& kind, int64_t i) { return *dir_ + "/" + kind + "_" + std::to_string(i) + ".raw"; }
  static const ddp::ImageDataset& data() { return **folder_; }

  // Every batch of an epoch; the loader's options with the given changes.
  static std::vector<ddp::ImageBatch> load(const std::shared_ptr<const ddp::ImageDataset>& dataset,
                                           const std::vector<std::vector<int64_t>>& batches,
                                           const std::function<void(ddp::ImageLoaderOptions&)>& change = {}) {
    ddp::ImageLoaderOptions o;
    o.threads = 2;
    o.seed = kSeed;
    o.normalize = false;
    o.transform.kind = ddp::ImageTransformKind::kTrain;
    o.transform.size = kSize;
    o.transform.dctScaling = false;
    if (change) change(o);
    ddp::ImageLoader loader(dataset, o);
    loader.start(batches, kEpoch);
    std::vector<ddp::ImageBatch> all;
    while (auto b = loader.next()) all.push_back(std::move(*b));
    return all;
  }

  static std::string* dir_;
  static std::shared_ptr<const ddp::ImageDataset>* folder_;
  static nlohmann::json* request_;
  static nlohmann::json* reply_;
};
std::string* ImageDataTest::dir_ = nullptr;
std::shared_ptr<const ddp::ImageDataset>* ImageDataTest::folder_ = nullptr;
nlohmann::json* ImageDataTest::request_ = nullptr;
nlohmann::json* ImageDataTest::reply_ = nullptr;

// The DataError `f` throws, checked to be one line (a failure if it throws none, or another kind).
std::string dataErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const ddp::DataError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << "not one line: " << what;
    return what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a DataError: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no error";
  return "";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST_F(ImageDataTest, FolderOrderAndLabelsAreImageFolders) {
  // torchvision's make_dataset: classes sorted, sorted(os.walk(...)) then sorted names, so the
  // nested ant/sub/ comes after ant's own files.
  EXPECT_EQ(data().classes(), (std::vector<std::string>{"ant", "bee", "cat"}));
  ASSERT_EQ(data().size(), 18);
  EXPECT_TRUE(has(data().name(4), "ant/a4.JPG")) << data().name(4);
  EXPECT_TRUE(has(data().name(5), "ant/sub/a5.png")) << data().name(5);
  EXPECT_TRUE(has(data().name(6), "bee/b0.jpg")) << data().name(6);
  for (int64_t i = 0; i < data().size(); ++i) EXPECT_EQ(data().label(i), i / 6) << i;
}

// torchvision's ImageFolder also lists .bmp/.webp/.tif/.tiff/.ppm/.pgm and links that lead nowhere
// (then fails reading one); this lists JPEG and PNG only, and says what it left out (was silent).
TEST_F(ImageDataTest, ImagesTorchvisionWouldListButThisDoesNotAreNamed) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(*dir_) / "other_formats";
  fs::create_directories(root / "a");
  fs::copy_file(data().name(0), root / "a" / "kept.jpg");
  fs::copy_file(data().name(0), root / "a" / ".png");  // a name that ends with .png: torchvision lists it
  std::ofstream(root / "a" / "y.webp") << "RIFF";
  std::ofstream(root / "a" / "x.bmp") << "BM";  // after y.webp in the directory, first in sorted order
  std::ofstream(root / "a" / "notes.txt") << "not an image";
  fs::create_symlink(root / "a" / "nowhere.jpg", root / "a" / "dead.jpg");
  const auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(16);
  spdlog::default_logger()->sinks().push_back(sink);
  const ddp::ImageDataset listed = ddp::ImageDataset::folder(root.string());
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(listed.size(), 2);
  EXPECT_TRUE(has(listed.name(0), "/a/.png")) << listed.name(0);  // '.' sorts before 'k'
  std::string log;
  for (const std::string& line : sink->last_formatted()) log += line;
  EXPECT_TRUE(has(log, "holds 2 image(s) in formats torchvision's ImageFolder reads but this does not (the first: '" +
                           (root / "a" / "x.bmp").string()))
      << log;
  EXPECT_TRUE(has(log, "holds 1 link(s) to images that do not exist (the first: '" + (root / "a" / "dead.jpg").string()))
      << log;
  fs::remove_all(root);
}

TEST_F(ImageDataTest, DecodesWhatPillowDecodes) {
  // JPEG (RGB 4:2:0 / 4:4:4, gray, progressive, CMYK) and PNG (RGB, gray, 1-bit, palette with
  // transparency, RGBA, LA, 16-bit, interlaced): Image.open(...).convert("RGB"), byte for byte.
  for (int64_t i = 0; i < data().size(); ++i) {
    SCOPED_TRACE(data().name(i));
    const ddp::RgbImage ours = ddp::decodeImageFile(data().name(i));
    const auto dims = reply_->at("decode").at(static_cast<size_t>(i));
    EXPECT_EQ(ours.height, dims[0].get<int64_t>());
    EXPECT_EQ(ours.width, dims[1].get<int64_t>());
    EXPECT_EQ(maxDifference(ours.pixels, readBytes(out("decode", i))), 0);
    const auto bytes = data().read(i);
    const ddp::ImageHeader header = ddp::readImageHeader(bytes.data(), bytes.size(), data().name(i));
    EXPECT_EQ(header.height, ours.height);
    EXPECT_EQ(header.width, ours.width);
  }
}

TEST_F(ImageDataTest, DecodesOddPngsAsPillow) {
  const auto& extra = request_->at("extra");
  const size_t first = reply_->at("decode").size() - extra.size();
  for (size_t q = 0; q < extra.size(); ++q) {
    const std::string file = extra[q];
    SCOPED_TRACE(file);
    const ddp::RgbImage ours = ddp::decodeImageFile(file);
    const auto dims = reply_->at("decode").at(first + q);
    EXPECT_EQ(ours.height, dims[0].get<int64_t>());
    EXPECT_EQ(ours.width, dims[1].get<int64_t>());
    EXPECT_EQ(maxDifference(ours.pixels, readBytes(file + ".raw")), 0);
  }
}

TEST_F(ImageDataTest, DctScaledJpegsArePillowsDraft) {
  const auto& scaled = request_->at("scaled");
  const size_t first = static_cast<size_t>(data().size());  // the scaled decodes follow the full ones
  ASSERT_GT(scaled.size(), 0u);
  for (size_t q = 0; q < scaled.size(); ++q) {
    const int64_t i = scaled[q]["index"];
    const int denom = scaled[q]["denom"];
    SCOPED_TRACE(data().name(i) + " at 1/" + std::to_string(denom));
    const auto dims = reply_->at("decode").at(first + q);
    ddp::ImageDecodeOptions o;
    o.minHeight = dims[0].get<int64_t>();  // the smallest scale still at least Pillow's draft size
    o.minWidth = dims[1].get<int64_t>();
    const ddp::RgbImage ours = ddp::decodeImageFile(data().name(i), o);
    ASSERT_EQ(ours.height, o.minHeight);
    ASSERT_EQ(ours.width, o.minWidth);
    EXPECT_EQ(maxDifference(ours.pixels, readBytes(out("scaled" + std::to_string(denom), i))), 0);
  }
}

TEST_F(ImageDataTest, CropBoxIsTorchvisionsGetParamsOnTheSameDraws) {
  const auto& crops = request_->at("crops");
  int fallbacks = 0;
  for (size_t q = 0; q < crops.size(); ++q) {
    const int64_t h = crops[q]["height"], w = crops[q]["width"];
    ddp::SampleRandom random(77, 5, static_cast<int64_t>(q));
    const ddp::CropBox box = ddp::randomResizedCropParams(h, w, random);
    const auto want = reply_->at("crops").at(q).get<std::vector<int64_t>>();
    EXPECT_EQ((std::vector<int64_t>{box.top, box.left, box.height, box.width, random.draws()}), want)
        << h << "x" << w << " case " << q;
    if (want[4] == 20) ++fallbacks;  // ten tries without a fit: the centre crop
  }
  EXPECT_GT(fallbacks, 20);  // the fallback is exercised, not only the tries
}

TEST_F(ImageDataTest, TrainTransformIsTorchvisionsOnPil) {
  // RandomResizedCrop(24) + RandomHorizontalFlip() on Pillow's RGB image, draws replayed; no DCT
  // scaling, so the bytes are torchvision's exactly.
  ddp::ImageTransformOptions o;
  o.kind = ddp::ImageTransformKind::kTrain;
  o.size = kSize;
  o.dctScaling = false;
  int flips = 0;
  for (int64_t i = 0; i < data().size(); ++i) {
    SCOPED_TRACE(data().name(i));
    const auto bytes = data().read(i);
    const ddp::RgbImage ours = ddp::transformImage(bytes.data(), bytes.size(), data().name(i), o, kSeed, kEpoch, i);
    ASSERT_EQ(ours.height, kSize);
    EXPECT_EQ(maxDifference(ours.pixels, readBytes(out("train", i))), 0);
    flips += reply_->at("train").at(static_cast<size_t>(i)).at(4).get<int>();
  }
  EXPECT_GT(flips, 0);
  EXPECT_LT(flips, data().size());
}

TEST_F(ImageDataTest, DctScaledTransformsArePillowsDraftAndBoxResize) {
  // With dctScaling, a JPEG whose region is at least twice the target decodes at 1/2, 1/4 or 1/8:
  // the bytes are then Pillow's Image.draft + resize(box=the region scaled), not torchvision's.
  int scaled = 0;
  for (size_t q = 0; q < request_->at("dct").size(); ++q) {
    const auto& r = request_->at("dct")[q];
    const int64_t i = static_cast<int64_t>(q / 2);
    SCOPED_TRACE(data().name(i) + " " + r["kind"].get<std::string>());
    ddp::ImageTransformOptions o;
    o.kind = r["kind"] == "train" ? ddp::ImageTransformKind::kTrain : ddp::ImageTransformKind::kEval;
    o.size = kSize;
    o.dctScaling = true;
    const auto bytes = data().read(i);
    const ddp::RgbImage ours = ddp::transformImage(bytes.data(), bytes.size(), data().name(i), o, kSeed, kEpoch, i);
    EXPECT_EQ(maxDifference(ours.pixels, readBytes(r["out"].get<std::string>())), 0);
    scaled += reply_->at("dct").at(q).get<int>() > 1;
  }
  EXPECT_GE(scaled, 8);  // the scaled path is taken, at several scales
}

TEST_F(ImageDataTest, EvalTransformAndNormalizeAreTorchvisions) {
  // Resize(27) + CenterCrop(24) (size * 8 / 7, as 256 for 224), then ToTensor + Normalize in float32.
  auto dataset = *folder_;
  std::vector<std::vector<int64_t>> batches = {{0, 1, 2, 3, 4, 5, 6}, {7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}};
  for (bool normalize : {false, true}) {
    const auto got = load(dataset, batches, [&](ddp::ImageLoaderOptions& o) {
      o.transform.kind = ddp::ImageTransformKind::kEval;
      o.normalize = normalize;
    });
    ASSERT_EQ(got.size(), 2u);
    for (const auto& b : got) {
      for (size_t r = 0; r < b.indices.size(); ++r) {
        const int64_t i = b.indices[r];
        SCOPED_TRACE(data().name(i));
        EXPECT_EQ(b.labels[static_cast<int64_t>(r)].item<int64_t>(), data().label(i));
        if (!normalize) {
          EXPECT_EQ(b.images.scalar_type(), at::kByte);
          EXPECT_EQ(maxDifference(hwcOf(b.images, static_cast<int64_t>(r)), readBytes(out("eval", i))), 0);
          continue;
        }
        EXPECT_EQ(b.images.scalar_type(), at::kFloat);
        const auto want = readFloats(out("evalf", i));
        const at::Tensor row = b.images[static_cast<int64_t>(r)].contiguous();
        ASSERT_EQ(row.numel(), static_cast<int64_t>(want.size()));
        double worst = 0;
        for (int64_t p = 0; p < row.numel(); ++p) {
          worst = std::max(worst, std::abs(double(row.data_ptr<float>()[p]) - double(want[static_cast<size_t>(p)])));
        }
        EXPECT_EQ(worst, 0.0);  // the same float32 operations in PyTorch's order: bitwise equal
      }
    }
  }
}

// normalizeImage alone (what the worker's streamed loader calls): HWC bytes to CHW floats by the
// formula (x / 255 - mean) / std in float32; anything but 3 means or deviations is one ConfigError.
TEST(NormalizeImage, IsToTensorAndNormalizeByTheFormula) {
  ddp::RgbImage image;
  image.height = 1;
  image.width = 2;
  image.pixels = {0, 128, 255, 10, 20, 30};  // pixel 0: R G B, pixel 1: R G B
  const std::vector<float> mean = {0.5f, 0.25f, 0.0f};
  const std::vector<float> stddev = {0.5f, 2.0f, 1.0f};
  std::vector<float> out(6, -1.0f);
  ddp::normalizeImage(image, out.data(), mean, stddev);
  const auto f = [&](int byte, size_t c) { return (static_cast<float>(byte) / 255.0f - mean[c]) / stddev[c]; };
  const std::vector<float> want = {f(0, 0), f(10, 0), f(128, 1), f(20, 1), f(255, 2), f(30, 2)};  // CHW
  EXPECT_EQ(out, want);
  EXPECT_THROW(ddp::normalizeImage(image, out.data(), {0.5f, 0.5f}, stddev), ddp::ConfigError);
}

TEST_F(ImageDataTest, EveryRankSeesEverySampleOnceWithTorchvisionsCrops) {
  auto dataset = *folder_;
  for (int world : {2, 3}) {
    std::vector<int> seen(static_cast<size_t>(data().size()), 0);
    for (int rank = 0; rank < world; ++rank) {
      ddp::SamplerOptions so;
      so.seed = 9;
      so.pad = false;
      ddp::DistributedSampler sampler(data().size(), world, rank, so);
      for (const auto& b : load(dataset, sampler.epochBatches(kEpoch, 4))) {
        for (size_t r = 0; r < b.indices.size(); ++r) {
          const int64_t i = b.indices[r];
          ++seen[static_cast<size_t>(i)];
          // Rank and thread do not change a sample's crop: the bytes are the reference's.
          EXPECT_EQ(maxDifference(hwcOf(b.images, static_cast<int64_t>(r)), readBytes(out("train", i))), 0)
              << "world " << world << " rank " << rank << " sample " << i;
        }
      }
    }
    for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << "world " << world << " sample " << i;
  }
}

TEST_F(ImageDataTest, ThreadCountAndResumeDoNotChangeTheBatches) {
  auto dataset = *folder_;
  ddp::DistributedSampler sampler(data().size(), 1, 0, ddp::SamplerOptions{true, 5});
  const auto batches = sampler.epochBatches(kEpoch, 5);
  auto withDct = [](int threads) {
    return [threads](ddp::ImageLoaderOptions& o) {
      o.threads = threads;
      o.prefetchBatches = 1;
      o.transform.dctScaling = true;  // the scaled decode path too (a different answer, still deterministic)
      o.normalize = true;
    };
  };
  const auto one = load(dataset, batches, withDct(1));
  const auto four = load(dataset, batches, withDct(4));
  ASSERT_EQ(one.size(), batches.size());
  ASSERT_EQ(four.size(), batches.size());
  for (size_t b = 0; b < batches.size(); ++b) {
    EXPECT_EQ(one[b].indices, batches[b]);
    EXPECT_EQ(four[b].indices, batches[b]);
    EXPECT_TRUE(one[b].images.equal(four[b].images)) << "batch " << b;
    EXPECT_TRUE(one[b].labels.equal(four[b].labels)) << "batch " << b;
  }
  // An epoch resumed after its first two batches continues with the same samples and crops.
  const std::vector<std::vector<int64_t>> rest(batches.begin() + 2, batches.end());
  const auto resumed = load(dataset, rest, withDct(3));
  ASSERT_EQ(resumed.size(), rest.size());
  for (size_t b = 0; b < rest.size(); ++b) EXPECT_TRUE(resumed[b].images.equal(one[b + 2].images)) << "batch " << b;
}

TEST_F(ImageDataTest, TarShardsHoldTheFolderSet) {
  auto shards = std::make_shared<const ddp::ImageDataset>(ddp::ImageDataset::tarShards(*dir_ + "/shards/shard-*.tar"));
  ASSERT_EQ(shards->size(), data().size());
  EXPECT_EQ(shards->classes(), (std::vector<std::string>{"0", "1", "2"}));
  for (int64_t i = 0; i < data().size(); ++i) {
    EXPECT_EQ(shards->label(i), data().label(i)) << i;
    EXPECT_EQ(shards->read(i), data().read(i)) << shards->name(i);
  }
  EXPECT_TRUE(has(shards->name(11), "shard-1.tar:s1/000001.")) << shards->name(11);
  std::vector<std::vector<int64_t>> batches = {{3, 17, 0, 9}, {12, 5, 6}, {1, 2, 4, 7, 8, 10, 11, 13, 14, 15, 16}};
  const auto fromTar = load(shards, batches);
  const auto fromFolder = load(*folder_, batches);
  ASSERT_EQ(fromTar.size(), fromFolder.size());
  for (size_t b = 0; b < fromTar.size(); ++b) {
    EXPECT_TRUE(fromTar[b].images.equal(fromFolder[b].images)) << b;
    EXPECT_TRUE(fromTar[b].labels.equal(fromFolder[b].labels)) << b;
  }
}

TEST_F(ImageDataTest, TarMemberPathsOverAHundredBytesInEveryFormat) {
  // USTAR's prefix field, GNU's long-name member, a pax header: each shard holds samples 0 and 1.
  const ddp::ImageDataset shards = ddp::ImageDataset::tarShards(*dir_ + "/longnames/*.tar");
  ASSERT_EQ(shards.size(), 6);
  const char* formats[] = {"gnu", "pax", "ustar"};  // the glob's sorted order
  for (int64_t i = 0; i < 6; ++i) {
    const std::string want = std::string("a_rather_long_folder_name_04/") + formats[i / 2] + "_" + std::to_string(i % 2) +
                             (i % 2 == 0 ? ".jpg" : ".jpeg");
    EXPECT_TRUE(has(shards.name(i), "a_rather_long_folder_name_00/") && has(shards.name(i), want)) << shards.name(i);
    EXPECT_EQ(shards.read(i), data().read(i % 2)) << shards.name(i);
    EXPECT_EQ(shards.label(i), 0);
  }
}

// Raw 16 x 16 pixels on `threads` threads, bad images left out of their batches.
ddp::ImageLoaderOptions skippingBadImages(int threads) {
  ddp::ImageLoaderOptions o;
  o.threads = threads;
  o.normalize = false;
  o.skipBadImages = true;
  o.transform.size = 16;
  return o;
}

// A JPEG whose header breaks (cut inside its Huffman tables) failed every later JPEG its loader thread
// decoded (the thread's TurboJPEG handle stayed failed): with one thread, all of them were skipped.
TEST_F(ImageDataTest, ABrokenJpegHeaderLeavesTheNextJpegsOfItsThreadDecodable) {
  auto poison = std::make_shared<const ddp::ImageDataset>(ddp::ImageDataset::folder(*dir_ + "/bad/poison"));
  ASSERT_EQ(poison->size(), 5);  // a/0cut.jpg a/1good.jpg a/2good.jpg a/3good.jpg b/good.jpg
  ddp::ImageLoader loader(poison, skippingBadImages(1));
  loader.start({{0, 1, 2, 3, 4}}, 0);
  const auto batch = loader.next();
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->indices, (std::vector<int64_t>{1, 2, 3, 4}));
  ASSERT_EQ(batch->skippedNames.size(), 1u);
  EXPECT_TRUE(has(batch->skippedNames[0], "0cut.jpg")) << batch->skippedNames[0];
  EXPECT_EQ(loader.skipped(), 1);
}

TEST_F(ImageDataTest, BadImagesAreOneLineNamingTheFileOrSkippedAndCounted) {
  auto bad = std::make_shared<const ddp::ImageDataset>(ddp::ImageDataset::folder(*dir_ + "/bad/decode"));
  ASSERT_EQ(bad->size(), 5);  // a/good.jpg a/trunc.jpg b/corrupt.png b/good.png b/zgood.jpg
  const std::vector<std::vector<int64_t>> batches = {{0, 1}, {2, 3, 4}};
  const std::string truncated = dataErrorOf([&] { load(bad, batches); });
  EXPECT_TRUE(has(truncated, "a/trunc.jpg")) << truncated;
  EXPECT_TRUE(has(truncated, "cannot decode JPEG")) << truncated;
  const std::string corrupt = dataErrorOf([&] { load(bad, {{2, 3}}); });
  EXPECT_TRUE(has(corrupt, "b/corrupt.png")) << corrupt;

  ddp::ImageLoader loader(bad, skippingBadImages(3));
  loader.start(batches, 0);
  auto first = loader.next();
  auto second = loader.next();
  ASSERT_TRUE(first && second);
  EXPECT_FALSE(loader.next());
  // The bad sample is left out of its batch: one shorter, the rest in order.
  EXPECT_EQ(first->indices, (std::vector<int64_t>{0}));
  EXPECT_EQ(first->images.size(0), 1);
  EXPECT_EQ(first->labels.size(0), 1);
  ASSERT_EQ(first->skippedNames.size(), 1u);
  EXPECT_TRUE(has(first->skippedNames[0], "trunc.jpg"));
  EXPECT_EQ(second->indices, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(second->labels[0].item<int64_t>(), 1);
  EXPECT_EQ(loader.skipped(), 2);
  // The kept rows are what a clean batch of the same samples holds.
  const auto clean = load(bad, {{0}, {3, 4}}, [](ddp::ImageLoaderOptions& c) {
    c.transform.kind = ddp::ImageTransformKind::kEval;
    c.transform.size = 16;
    c.seed = 0;
  });
  EXPECT_TRUE(clean[1].images.equal(second->images));
}

TEST_F(ImageDataTest, MalformedSetsAreOneLineNamingTheFile) {
  const std::string empty = dataErrorOf([&] { ddp::ImageDataset::folder(*dir_ + "/bad/empty"); });
  EXPECT_TRUE(has(empty, "class folder '" + *dir_ + "/bad/empty/b' has no .jpg/.jpeg/.png images")) << empty;
  EXPECT_TRUE(has(dataErrorOf([&] { ddp::ImageDataset::folder(*dir_ + "/nowhere"); }), "is not a directory"));

  auto text = std::make_shared<const ddp::ImageDataset>(ddp::ImageDataset::folder(*dir_ + "/bad/text"));
  const std::string notImage = dataErrorOf([&] { load(text, {{0}}); });
  EXPECT_TRUE(has(notImage, "a/notes.jpg' is neither a JPEG nor a PNG")) << notImage;
  // skipBadImages is for images met broken while training, and covers this one too.
  EXPECT_EQ(load(text, {{0}}, [](ddp::ImageLoaderOptions& o) { o.skipBadImages = true; })[0].indices.size(), 0u);

  const std::string noLabel = dataErrorOf([&] { ddp::ImageDataset::tarShards(*dir_ + "/bad/nolabel.tar"); });
  EXPECT_TRUE(has(noLabel, "nolabel.tar': 'k2.jpg' has no label (k2.cls")) << noLabel;
  const std::string badLabel = dataErrorOf([&] { ddp::ImageDataset::tarShards(*dir_ + "/bad/badlabel.tar"); });
  EXPECT_TRUE(has(badLabel, "badlabel.tar:k1.cls' holds 'cat'")) << badLabel;
  const std::string notTar = dataErrorOf([&] { ddp::ImageDataset::tarShards(*dir_ + "/bad/notatar.tar"); });
  EXPECT_TRUE(has(notTar, "notatar.tar' is not a tar file")) << notTar;
  EXPECT_TRUE(has(dataErrorOf([&] { ddp::ImageDataset::tarShards(*dir_ + "/none-*.tar"); }), "no tar shard matches"));
  // A named pipe the glob matches is refused at once (a blocking open would wait for a writer forever).
  const std::string fifo = *dir_ + "/bad/pipe-000.tar";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  const std::string pipe = dataErrorOf([&] { ddp::ImageDataset::tarShards(*dir_ + "/bad/pipe-*.tar"); });
  std::remove(fifo.c_str());
  EXPECT_TRUE(has(pipe, "pipe-000.tar' is not a regular file")) << pipe;
  // A link back up the tree: the walk (symbolic links followed, as torchvision's os.walk(followlinks=True))
  // ends in ELOOP, named with the class folder and what to do.
  fs::create_directories(*dir_ + "/bad/loop/a");
  fs::copy_file(*dir_ + "/bad/decode/a/good.jpg", *dir_ + "/bad/loop/a/good.jpg");
  fs::create_directory_symlink("..", *dir_ + "/bad/loop/a/up");
  const std::string loop = dataErrorOf([&] { ddp::ImageDataset::folder(*dir_ + "/bad/loop"); });
  EXPECT_TRUE(has(loop, "cannot list class folder '" + *dir_ + "/bad/loop/a' (Too many levels of symbolic links at '"))
      << loop;
  EXPECT_TRUE(has(loop, "a symbolic link under it leads back to a folder above it")) << loop;
}

// Pillow's decompression-bomb rule (Image._decompression_bomb_check): more than 2 * MAX_IMAGE_PIXELS
// = 178956970 pixels is refused at open; tests/python/image_reference.py checks that Pillow refuses
// these two files. The limit is the header's width x height against maxPixels, > refused, = decoded.
TEST_F(ImageDataTest, AHeaderOverPillowsPixelLimitIsRefusedBeforeDecoding) {
  EXPECT_EQ(ddp::kMaxImagePixels, 2 * (1024 * 1024 * 1024 / 4 / 3));
  for (const std::string name : {"bomb.png", "bomb.jpg"}) {
    const std::string path = *dir_ + "/bad/bomb/" + name;
    const std::string error = dataErrorOf([&] { ddp::decodeImageFile(path); });
    EXPECT_TRUE(has(error, "image '" + path + "' says it is 20000 x 20000 (400000000 pixels), over the limit of "
                           "178956970")) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
    // Through the transform (what the loader runs) as well.
    const auto bytes = readBytes(path);
    ddp::ImageTransformOptions t;
    t.size = 16;
    const std::string transformed = dataErrorOf([&] { ddp::transformImage(bytes.data(), bytes.size(), path, t, 1, 0, 0); });
    EXPECT_TRUE(has(transformed, "over the limit of 178956970")) << transformed;
  }
  for (const std::string name : {"a/good.jpg", "b/good.png"}) {  // 40 x 30
    const std::string path = *dir_ + "/bad/decode/" + name;
    ddp::ImageDecodeOptions o;
    o.maxPixels = 40 * 30 - 1;
    EXPECT_TRUE(has(dataErrorOf([&] { ddp::decodeImageFile(path, o); }), "(1200 pixels), over the limit of 1199"));
    o.maxPixels = 40 * 30;
    EXPECT_EQ(ddp::decodeImageFile(path, o).pixels.size(), 40u * 30u * 3u);
    o.maxPixels = 0;  // no limit
    EXPECT_EQ(ddp::decodeImageFile(path, o).pixels.size(), 40u * 30u * 3u);
  }
}

}  // namespace
