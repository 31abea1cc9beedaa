#include "worker/data/idx_file.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "common/error.h"

namespace ddp::worker::data {
namespace {

// The idx header stores the data type in byte 3 and the rank in byte 4.
constexpr uint32_t kUbyteMagicBase = 0x0800;
// Bounds a header can claim before we believe it: generous for any image set,
// small enough that a corrupt header cannot ask for terabytes.
constexpr int64_t kMaxValues = int64_t{1} << 34;
constexpr unsigned kChunkBytes = 1u << 20;

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzHandle = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

// Reads up to `bytes` bytes; returns how many were read. Throws on stream errors
// such as a damaged deflate block or a gzip trailer that does not match.
size_t readSome(gzFile file, uint8_t* out, size_t bytes, const std::string& path,
                const std::string& what) {
  size_t done = 0;
  while (done < bytes) {
    const auto want = static_cast<unsigned>(std::min<size_t>(bytes - done, kChunkBytes));
    const int got = gzread(file, out + done, want);
    if (got < 0) {
      int code = 0;
      std::string msg = gzerror(file, &code);
      // zlib prefixes the message with the path, which ours already names.
      if (msg.rfind(path + ": ", 0) == 0) {
        msg.erase(0, path.size() + 2);
      }
      DDP_THROW(DataError, what, ": ", path, ": cannot decompress (zlib: ", msg,
                "); the file is corrupt, reinstall it");
    }
    if (got == 0) {
      break;
    }
    done += static_cast<size_t>(got);
  }
  return done;
}

uint32_t bigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

IdxArray readIdxUbyte(const std::string& path, int numDims, const std::string& what) {
  GzHandle file(gzopen(path.c_str(), "rb"));
  if (!file) {
    DDP_THROW(DataError, what, ": cannot open ", path, ": ", std::strerror(errno));
  }
  gzbuffer(file.get(), 1u << 18);

  const uint32_t expectedMagic = kUbyteMagicBase + static_cast<uint32_t>(numDims);
  std::vector<uint8_t> header(4 * (1 + static_cast<size_t>(numDims)));
  const size_t got = readSome(file.get(), header.data(), header.size(), path, what);
  if (got < 4) {
    DDP_THROW(DataError, what, ": ", path, ": file too short for an idx header (", got,
              " bytes); the file is truncated, reinstall it");
  }
  const uint32_t magic = bigEndian32(header.data());
  if (magic != expectedMagic) {
    DDP_THROW(DataError, what, ": ", path, ": bad magic number ", magic, " (expected ",
              expectedMagic, " for an idx", numDims,
              "-ubyte file); the file is corrupt or of another kind");
  }
  if (got < header.size()) {
    DDP_THROW(DataError, what, ": ", path, ": header truncated after ", got, " of ",
              header.size(), " bytes; reinstall the file");
  }

  IdxArray array;
  int64_t count = 1;
  for (int d = 0; d < numDims; ++d) {
    const auto dim = static_cast<int64_t>(bigEndian32(header.data() + 4 * (1 + d)));
    array.dims.push_back(dim);
    // Checked before multiplying: two 32-bit dims can already overflow int64.
    if (dim != 0 && count > kMaxValues / dim) {
      DDP_THROW(DataError, what, ": ", path, ": implausible header dimensions (more than ",
                kMaxValues, " values); the file is corrupt");
    }
    count *= dim;
  }

  // Grow as the data arrives so a lying header cannot make us allocate it all.
  const auto total = static_cast<size_t>(count);
  size_t filled = 0;
  while (filled < total) {
    const size_t step = std::min(total - filled, std::max<size_t>(filled, kChunkBytes));
    array.values.resize(filled + step);
    const size_t n = readSome(file.get(), array.values.data() + filled, step, path, what);
    filled += n;
    if (n < step) {
      DDP_THROW(DataError, what, ": ", path, ": truncated: the header promises ", total,
                " data bytes but the file holds ", filled, "; reinstall the file");
    }
  }
  uint8_t extra = 0;
  if (readSome(file.get(), &extra, 1, path, what) != 0) {
    DDP_THROW(DataError, what, ": ", path, ": trailing bytes after the ", total,
              " data bytes the header promises; the file is corrupt");
  }
  return array;
}

}  // namespace ddp::worker::data
