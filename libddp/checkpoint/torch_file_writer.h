// Writes what Python's torch.save writes: the zip format with a protocol-2
// pickle whose tensors are torch._utils._rebuild_tensor_v2 over typed CPU
// storages. PyTorch >= 2.6 loads it with plain torch.load(path) (default
// weights_only=True): no TorchScript type tags, only allowed globals.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "libddp/checkpoint/torch_file.h"

namespace ddp::checkpoint {

/// Builders for the value tree writeTorchFile() takes (the reader's PyValue).
PyValuePtr pyString(std::string text);
PyValuePtr pyInt(int64_t value);
PyValuePtr pyFloat(double value);
PyValuePtr pyBool(bool value);
PyValuePtr pyNone();
/// Detached, copied to CPU and made contiguous when written; strided layout only.
PyValuePtr pyTensor(const at::Tensor& tensor);
/// A plain dict (`{}` in Python).
PyValuePtr pyDict();
/// A collections.OrderedDict, the type Python's module.state_dict() returns.
PyValuePtr pyOrderedDict();
PyValuePtr pyList();
PyValuePtr pyTuple();
/// Appends `key: value` to a kDict, keeping insertion order (as Python dicts do).
void pySet(PyValue& dict, const std::string& key, PyValuePtr value);

/// The bytes of the torch.save zip archive for `root`: records data.pkl, byteorder
/// and data/<n> per tensor (the stream writer adds version). Throws CheckpointError
/// for values torch.load(weights_only=True) would refuse or that we cannot write
/// (kOther, sparse or quantized tensors, dtypes without a typed storage class).
std::string torchFileBytes(const PyValue& root);

/// torchFileBytes() written atomically to `path`: a failed write leaves the old file or none.
void writeTorchFile(const PyValue& root, const std::string& path);

}  // namespace ddp::checkpoint
