// Reader for the idx format of (Fashion-)MNIST, gzipped or not.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::worker::data {

/// An unsigned-byte idx array: dims from the header, values row-major.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> values;
};

/// Reads an idx file of unsigned bytes with exactly `numDims` dimensions (magic
/// 0x0800 + numDims: 2049 for labels, 2051 for images). zlib reads both gzip and
/// plain files. Throws ddp::DataError, prefixed with `what` (e.g. "fashion-mnist"),
/// on a bad magic number, implausible dimensions, a truncated or corrupt stream, or
/// trailing bytes the header does not account for.
IdxArray readIdxUbyte(const std::string& path, int numDims, const std::string& what);

}  // namespace ddp::worker::data
