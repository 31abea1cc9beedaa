// Streamed image data: JPEG/PNG files read and decoded per step on loader threads (never the whole
// set in memory), with torchvision's ImageNet recipe (RandomResizedCrop + RandomHorizontalFlip for
// training, Resize + CenterCrop for evaluation, then Normalize) computed as torchvision computes it
// on PIL images. Sources: torchvision's ImageFolder layout, or WebDataset-style tar shards.
//
//     auto data = std::make_shared<const ddp::ImageDataset>(ddp::ImageDataset::folder("/data/imagenet/train"));
//     ddp::DistributedSampler sampler(data->size(), group, {.seed = 7});
//     ddp::ImageLoaderOptions o;
//     o.threads = 8;
//     o.transform.kind = ddp::ImageTransformKind::kTrain;
//     o.device = group.device();
//     ddp::ImageLoader loader(data, o);
//     for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//       loader.start(sampler.epochBatches(epoch, 256), epoch);
//       while (auto batch = loader.next()) { /* batch->images [B,3,224,224], batch->labels [B] */ }
//     }
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddp {

/// An 8-bit RGB image, rows of width × 3 interleaved bytes (Pillow's "RGB" as numpy sees it).
struct RgbImage {
  int64_t height = 0;
  int64_t width = 0;
  std::vector<uint8_t> pixels;  // height * width * 3
};

/// What the header of an encoded image says, without decoding it.
struct ImageHeader {
  bool jpeg = false;  // else PNG
  int64_t height = 0;
  int64_t width = 0;
};

/// The header of a JPEG or PNG held in memory; `name` (a path, a tar member) goes into the
/// DataError thrown for anything else.
ImageHeader readImageHeader(const uint8_t* data, size_t size, const std::string& name);

/// Pillow's limit: 2 * Image.MAX_IMAGE_PIXELS (1024 * 1024 * 1024 // 4 // 3 = 89478485).
inline constexpr int64_t kMaxImagePixels = 2 * 89478485;

struct ImageDecodeOptions {
  /// > 0 (both): a JPEG is decoded at the smallest DCT scale among 1/8, 1/4, 1/2 (libjpeg-turbo's
  /// scaled IDCT, Pillow's Image.draft) whose size is still >= minHeight x minWidth; 0: full size.
  int64_t minHeight = 0;
  int64_t minWidth = 0;
  /// An image whose header claims more pixels (width x height) is refused with a DataError before
  /// anything is allocated: Pillow's decompression-bomb limit (2 x Image.MAX_IMAGE_PIXELS, where
  /// Pillow raises DecompressionBombError), which a corrupt header of a few bytes would otherwise
  /// turn into a multi-gigabyte allocation. 0: no limit (Pillow's MAX_IMAGE_PIXELS = None).
  int64_t maxPixels = kMaxImagePixels;
};

/// Decodes a JPEG (TurboJPEG, accurate DCT, fancy upsampling: Pillow's defaults) or a PNG (libpng)
/// to the bytes Pillow's Image.open(...).convert("RGB") gives: gray, palette and alpha become RGB
/// (alpha dropped; 16-bit colour to its high byte, 16-bit gray clipped to 255 as Pillow's "I;16"),
/// CMYK as Pillow converts Adobe-inverted CMYK. A truncated or corrupt image throws ddp::DataError
/// naming `name`, one line.
RgbImage decodeImage(const uint8_t* data, size_t size, const std::string& name, const ImageDecodeOptions& options = {});
/// decodeImage on a whole file.
RgbImage decodeImageFile(const std::string& path, const ImageDecodeOptions& options = {});

/// A region of an image, in pixels (torchvision's (top, left, height, width)).
struct CropBox {
  int64_t top = 0;
  int64_t left = 0;
  int64_t height = 0;
  int64_t width = 0;
};

/// Pillow's image.crop(box).resize((width, height), Image.BILINEAR): antialiased bilinear in two
/// 8-bit passes (horizontal, then vertical), what torchvision's resize does on PIL images. The
/// filter sees the crop only (its edges clamp), as after Pillow's crop.
RgbImage resizeBilinear(const RgbImage& image, const CropBox& crop, int64_t height, int64_t width);

/// The uniform draws of one sample in one epoch: a counter-based stream (splitmix64 of seed, epoch,
/// sample index and draw number), so a sample's crops do not depend on which thread decodes it, in
/// what order, or whether the run resumed mid-epoch.
class SampleRandom {
 public:
  SampleRandom(uint64_t seed, int64_t epoch, int64_t index);
  /// The next draw, uniform in [0, 1) (53 bits).
  double uniform();
  /// torch.randint(low, high): low + floor(uniform() * (high - low)).
  int64_t randint(int64_t low, int64_t high);
  /// Draws taken so far.
  int64_t draws() const { return counter_; }

 private:
  uint64_t key_;
  int64_t counter_ = 0;
};

/// torchvision's RandomResizedCrop arguments.
struct RandomResizedCropOptions {
  double scaleMin = 0.08;  // scale=(0.08, 1.0): the crop's share of the image's area
  double scaleMax = 1.0;
  double ratioMin = 3.0 / 4.0;  // ratio=(3/4, 4/3): the crop's width / height, drawn log-uniform
  double ratioMax = 4.0 / 3.0;
};

/// RandomResizedCrop.get_params on a height x width image with the draws of `random`: ten tries of
/// (area scale uniform, log-ratio uniform, then randint top, randint left when the crop fits), else
/// the centre crop clamped to the ratio range. Draws are taken in torchvision's order (float32
/// uniforms as torch.empty(1).uniform_ makes them).
CropBox randomResizedCropParams(int64_t height, int64_t width, SampleRandom& random,
                                const RandomResizedCropOptions& options = {});

enum class ImageTransformKind {
  kTrain,   // RandomResizedCrop(size) + RandomHorizontalFlip(0.5)
  kEval,    // Resize(resizeSize) (shorter side) + CenterCrop(size)
  kResize,  // the whole image resized to size x size (no randomness)
};

/// The per-sample transform, then ToTensor + Normalize when the output is float.
struct ImageTransformOptions {
  ImageTransformKind kind = ImageTransformKind::kEval;
  int64_t size = 224;            // the output is size x size
  int64_t resizeSize = 0;        // kEval's shorter side; 0: size * 8 / 7 rounded down (256 for 224)
  RandomResizedCropOptions crop;  // kTrain
  double flipProbability = 0.5;   // kTrain: RandomHorizontalFlip(p); 0 = never
  /// Decode JPEGs at a DCT scale (1/2, 1/4, 1/8) when the region needed is at least twice the
  /// output on both sides: several times faster on large photos, but the bytes then differ from
  /// Pillow's full-size decode + resize (as with DALI or FFCV). false: exactly torchvision's bytes.
  bool dctScaling = true;
  int64_t maxPixels = kMaxImagePixels;  // ImageDecodeOptions::maxPixels
};

/// One sample through the transform: the decoded, cropped, resized (and flipped) RGB image. The
/// draws come from SampleRandom(seed, epoch, index). `name` names the file in errors.
RgbImage transformImage(const uint8_t* data, size_t size, const std::string& name, const ImageTransformOptions& options,
                        uint64_t seed, int64_t epoch, int64_t index);

/// ToTensor + Normalize of one image: its HWC bytes into float32 CHW at `out` (3 x height x width
/// floats), (x / 255 - mean[c]) / stddev[c] computed in float32 as PyTorch computes it. What
/// ImageLoader does to each sample with `normalize`; for a loader of one's own.
void normalizeImage(const RgbImage& image, float* out, const std::vector<float>& mean, const std::vector<float>& stddev);

/// The samples of a data set: where each one's bytes are and its label. Two layouts:
/// torchvision's ImageFolder (`root/<class>/<files>`, classes and files sorted), and WebDataset tar
/// shards (members grouped by key: `<key>.jpg|.jpeg|.png` with `<key>.cls` holding the class index as
/// text), indexed by one pass over the tar headers at open. Nothing is decoded at open. The const
/// methods may be called from several threads at once. Move-only.
class ImageDataset {
 public:
  /// Every .jpg/.jpeg/.png (any case) under `root/<class>/`, recursively, in torchvision's order
  /// (sorted(os.walk(...)), then sorted names); other files are not samples. Throws DataError for
  /// a missing root, no class folder, a class folder without images.
  static ImageDataset folder(const std::string& root);
  /// The shards a glob matches (sorted), samples in shard then member order; consecutive members
  /// with one key (the path up to the file name's first '.') make a sample, and members of other
  /// extensions (.json, .txt, ...) are ignored. Long paths in every tar format (USTAR prefix, GNU
  /// long names, pax). Throws DataError naming the shard and member for a malformed or truncated
  /// tar, an image without its .cls, a .cls without an image or not a non-negative integer, two
  /// images under one key. A file's content (JPEG, PNG or neither) is only looked at when loaded.
  static ImageDataset tarShards(const std::string& glob);

  ~ImageDataset();
  ImageDataset(ImageDataset&&) noexcept;
  ImageDataset& operator=(ImageDataset&&) noexcept;

  int64_t size() const;
  /// Folder: the class folder names; tar shards: "0", "1", ... up to the largest label.
  const std::vector<std::string>& classes() const;
  int64_t label(int64_t index) const;
  /// The file (folder), or "shard.tar:member" (tar), for messages.
  std::string name(int64_t index) const;
  /// The encoded bytes of sample `index` (one read).
  std::vector<uint8_t> read(int64_t index) const;

 private:
  struct Impl;
  explicit ImageDataset(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct ImageLoaderOptions {
  int threads = 4;                 // decoding threads (DataLoader's num_workers)
  int prefetchBatches = 2;         // batches decoded ahead of the one next() returns; memory is
                                   // (prefetchBatches + 1) x batch, never the data set
  ImageTransformOptions transform;
  uint64_t seed = 0;               // the transform's draws: SampleRandom(seed, epoch, index)
  bool normalize = true;           // true: float32 (x / 255 - mean) / std (ToTensor + Normalize); false: uint8
  std::vector<float> mean = {0.485f, 0.456f, 0.406f};  // ImageNet's, as torchvision's reference
  std::vector<float> stddev = {0.229f, 0.224f, 0.225f};
  c10::Device device = c10::Device(c10::kCPU);  // CUDA: batches assembled in pinned memory, copied non-blocking
  /// false: a corrupt or truncated image throws DataError naming the file from next(). true: it is
  /// logged and left out of its batch (that batch is one shorter: the same on every run and thread
  /// count, and no other sample is read twice), counted in skipped().
  bool skipBadImages = false;
};

/// One batch: images [B, 3, size, size] (float32 normalized, or uint8) and int64 labels [B], on the
/// loader's device; `indices` are the data set indices it holds, in order.
struct ImageBatch {
  at::Tensor images;
  at::Tensor labels;
  std::vector<int64_t> indices;
  std::vector<std::string> skippedNames;  // with skipBadImages: the files left out of this batch
};

/// Decodes batches of a data set on `threads` threads, `prefetchBatches` ahead, in the order of the
/// batches given: the same batches whatever the thread count. One epoch at a time.
class ImageLoader {
 public:
  ImageLoader(std::shared_ptr<const ImageDataset> dataset, ImageLoaderOptions options);
  ~ImageLoader();
  ImageLoader(const ImageLoader&) = delete;
  ImageLoader& operator=(const ImageLoader&) = delete;

  /// Starts an epoch over `batches` (e.g. DistributedSampler::epochBatches, or the batches left
  /// after a resume); the draws of a sample depend on (seed, epoch, index) only. Abandons any epoch
  /// still running.
  void start(std::vector<std::vector<int64_t>> batches, int64_t epoch);
  /// The next batch in order, nullopt after the last. Throws the DataError of a bad image (unless
  /// skipBadImages).
  std::optional<ImageBatch> next();
  /// Images left out as bad since the loader was made.
  int64_t skipped() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
