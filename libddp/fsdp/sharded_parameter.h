// Which rows of a fully sharded parameter this rank holds: what sharded checkpoints
// (libddp/checkpoint/sharded_checkpoint.cc) need to know of ddp::fullyShard's units.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp::fsdp {

struct ParameterShard {
  std::vector<int64_t> fullShape;
  int64_t rowStart = 0;  // the first row of the full tensor this rank holds (dim 0)
  int64_t rows = 0;      // how many: the parameter's data is rows × fullShape[1:] while sharded
  bool gathered = false; // its unit is unsharded now (the data is the full tensor)
  std::string unit;      // the unit's module name, for messages
};

/// The shard `param` is, when a fullyShard unit holds it; nullopt for any other tensor.
std::optional<ParameterShard> shardOfParameter(const at::Tensor& param);

}  // namespace ddp::fsdp
