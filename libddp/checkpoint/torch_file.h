// Reads files written by Python's torch.save (zip format, PyTorch >= 1.6) and
// by LibTorch's torch::pickle_save (older ddp-launch files), mapping every tensor to CPU (like
// map_location="cpu"). LibTorch's own unpickler turns collections.OrderedDict
// into None, so it cannot read a Python state_dict; this reader can.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ddp::checkpoint {

/// A value from the pickle: the subset torch.save uses for state_dicts and
/// checkpoints (None, bool, int, float, str, tuple, list, dict, tensor).
struct PyValue {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kTuple, kList, kDict, kTensor, kOther };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string text;                      // kString; kOther: "module.name" of what it was
  std::vector<std::shared_ptr<PyValue>> items;  // kTuple, kList
  std::vector<std::pair<std::shared_ptr<PyValue>, std::shared_ptr<PyValue>>> entries;  // kDict, in order
  bool ordered = false;                  // kDict: a collections.OrderedDict (what state_dict() returns)
  at::Tensor tensor;                     // kTensor, CPU

  /// Dict lookup by string key; nullptr when absent or not a dict.
  const PyValue* get(const std::string& key) const;
};
using PyValuePtr = std::shared_ptr<PyValue>;

/// Parses `path`. Throws CheckpointError naming the file when it is missing,
/// truncated, corrupt, in the legacy pre-1.6 format, or uses objects other than
/// containers and tensors.
PyValuePtr readTorchFile(const std::string& path);

/// Parses a plain pickle file (pickle.dump's, protocol 2 to 5) of the same values, tensors
/// excepted (nanoGPT's meta.pkl). CheckpointError naming the file for one that is missing, not a
/// pickle, truncated or holding other objects.
PyValuePtr readPickleFile(const std::string& path);

/// The flat {name: tensor} entries of a dict (a state_dict), in file order;
/// non-tensor values are skipped.
std::vector<std::pair<std::string, at::Tensor>> tensorEntries(const PyValue& dict);

}  // namespace ddp::checkpoint
