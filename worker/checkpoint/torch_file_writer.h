// Writes what Python's torch.save writes: the zip format with a protocol-2
// pickle whose tensors are torch._utils._rebuild_tensor_v2 over typed CPU
// storages. PyTorch >= 2.6 loads it with plain torch.load(path) (default
// weights_only=True): no TorchScript type tags, only allowed globals.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "worker/checkpoint/torch_file.h"

namespace ddp::checkpoint {

/// Builders for the value tree writeTorchFile() takes (the reader's PyValue).
PyValuePtr pyString(std::string text);
PyValuePtr pyInt(int64_t value);
PyValuePtr pyFloat(double value);
PyValuePtr pyBool(bool value);
PyValuePtr pyNone();
/// Detached, copied to CPU and made contiguous when written.
PyValuePtr pyTensor(const at::Tensor& tensor);
PyValuePtr pyDict();
PyValuePtr pyList();
/// Appends `key: value` to a kDict, keeping insertion order (as Python dicts do).
void pySet(PyValue& dict, const std::string& key, PyValuePtr value);

/// The bytes of the torch.save zip archive for `root`. Throws CheckpointError
/// for values torch.save would not produce here (kOther, unsupported dtypes).
std::string torchFileBytes(const PyValue& root);

/// torchFileBytes() written atomically to `path`: a failed write leaves the old file or none.
void writeTorchFile(const PyValue& root, const std::string& path);

}  // namespace ddp::checkpoint
