#include "worker/data/fashion_mnist.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <filesystem>
#include <memory>
#include <utility>

#include "common/error.h"
#include "common/relative_path.h"
#include "worker/data/idx_file.h"

namespace ddp::worker::data {
namespace {

constexpr const char* kWhat = "fashion-mnist";
constexpr int64_t kSide = 28;

// The .gz the Debian package ships, else the same name decompressed.
std::string resolve(const std::string& root, const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path base = fs::path(root) / name;
  const fs::path gz = fs::path(base.string() + ".gz");
  std::error_code ec;
  if (fs::is_regular_file(gz, ec)) {
    return gz.string();
  }
  if (fs::is_regular_file(base, ec)) {
    return base.string();
  }
  if (!fs::is_directory(root, ec)) {
    DDP_THROW(DataError, kWhat, ": data root ", root, relativePathNote(root), " is not a directory (looked for ",
              gz.string(), "); install Debian package dataset-fashion-mnist or set data.root");
  }
  DDP_THROW(DataError, kWhat, ": ", gz.string(), " not found (nor ", base.string(),
            "); install Debian package dataset-fashion-mnist or set data.root");
}

}  // namespace

TensorDataset loadFashionMnist(const std::string& root, Split split) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string imagePath = resolve(root, prefix + "-images-idx3-ubyte");
  const std::string labelPath = resolve(root, prefix + "-labels-idx1-ubyte");

  const IdxArray labels = readIdxUbyte(labelPath, 1, kWhat);
  IdxArray images = readIdxUbyte(imagePath, 3, kWhat);
  const int64_t n = images.dims[0];
  if (images.dims[1] != kSide || images.dims[2] != kSide) {
    DDP_THROW(DataError, kWhat, ": ", imagePath, ": images are ", images.dims[1], "x",
              images.dims[2], ", expected ", kSide, "x", kSide,
              "; is this Fashion-MNIST?");
  }
  if (labels.dims[0] != n) {
    DDP_THROW(DataError, kWhat, ": ", imagePath, " holds ", n, " images but ", labelPath,
              " holds ", labels.dims[0], " labels; the files come from different sets");
  }

  TensorDataset ds;
  ds.labels = at::empty({n}, at::kLong);
  int64_t* label = ds.labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    label[i] = labels.values[static_cast<size_t>(i)];
    if (label[i] >= kFashionMnistClasses) {
      DDP_THROW(DataError, kWhat, ": ", labelPath, ": label ", label[i], " of sample ", i,
                " is outside [0, ", kFashionMnistClasses, "); the file is corrupt");
    }
  }

  // The pixels stay uint8 (47 MB for the training set, not 188 MB of float32); batches are
  // normalised as they are assembled (gatherBatch), with the same float32 operations.
  auto pixels = std::make_shared<std::vector<uint8_t>>(std::move(images.values));
  ds.images = at::from_blob(
      pixels->data(), {n, 1, kSide, kSide}, [pixels](void*) mutable { pixels.reset(); }, at::kByte);
  ds.mean = {kFashionMnistMean};
  ds.stddev = {kFashionMnistStd};
  return ds;
}

}  // namespace ddp::worker::data
