#include "libddp/checkpoint/sharded_checkpoint.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <fcntl.h>
#include <torch/nn/module.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "common/error.h"
#include "ddp/files.h"
#include "libddp/checkpoint/checkpoint_dir.h"
#include "libddp/fsdp/sharded_parameter.h"

namespace ddp::checkpoint {
namespace fs = std::filesystem;
namespace {

std::string rankFileName(int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank-%05d.pt", rank);
  return name;
}

// The fully sharded parameters of `module` by name.
std::map<std::string, fsdp::ParameterShard> shardedParameters(const torch::nn::Module& module) {
  std::map<std::string, fsdp::ParameterShard> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (auto shard = fsdp::shardOfParameter(item.value())) out.emplace(item.key(), std::move(*shard));
  }
  return out;
}

// The sharded parameter an entry is about: its value ("fc.weight") or its optimizer state of the
// same dims ("exp_avg.fc.weight"); the optimizer's prefixes hold no dot. A 0-dim "step.<name>" is
// replicated.
const fsdp::ParameterShard* parameterOfKey(const std::map<std::string, fsdp::ParameterShard>& params,
                                           const std::string& key, int64_t dims) {
  auto it = params.find(key);
  if (it == params.end()) {
    const size_t dot = key.find('.');
    if (dot == std::string::npos) return nullptr;
    it = params.find(key.substr(dot + 1));
    if (it == params.end()) return nullptr;
  }
  return static_cast<int64_t>(it->second.fullShape.size()) == dims ? &it->second : nullptr;
}

// Rank r's rows of a dim-0 of `rows` over `world` ranks, as ShardLayout (torch.chunk) deals them.
std::pair<int64_t, int64_t> rowsOfRank(int64_t rows, int world, int rank) {
  const int64_t chunk = (rows + world - 1) / world;
  const int64_t start = std::min(rows, rank * chunk);
  return {start, std::min(rows, start + chunk)};
}

std::string shapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

void fsyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    (void)::fsync(fd);
    ::close(fd);
  }
}

// Every rank learns whether one failed; those that did not throw name the first that did.
void agree(ProcessGroup& group, const std::string& error, const std::string& what) {
  const int64_t mine = error.empty() ? group.size() : group.rank();
  at::Tensor first = at::tensor({mine}, at::kLong).to(group.collectiveDevice());
  group.allReduce(first, ReduceOp::kMin);
  const int64_t who = first.cpu().item<int64_t>();
  if (!error.empty()) throw CheckpointError(error);
  if (who < group.size()) DDP_THROW(CheckpointError, what, ": rank ", who, " failed (its log says why)");
}

// This rank's part of `from` into `to`, and (rank 0) the manifest's entry of each sharded
// tensor into `tensors`: every entry of a sharded parameter is its rows; the rest is replicated,
// written by rank 0 only. Returns the error ("" when none): every rank agrees on it after.
std::string splitForRank(const NamedTensors& from, const std::map<std::string, fsdp::ParameterShard>& params, int rank,
                         int world, NamedTensors& to, nlohmann::json& tensors) {
  to.clear();
  for (const auto& [key, tensor] : from) {
    const fsdp::ParameterShard* shard = parameterOfKey(params, key, tensor.dim());
    if (shard == nullptr) {
      if (rank == 0) to.emplace_back(key, tensor);
      continue;
    }
    if (shard->gathered) {
      return "cannot checkpoint '" + key + "': the unit of " + shard->unit +
             " is unsharded (unshard() without reshard()); call reshard() first";
    }
    if (tensor.size(0) != shard->rows) {
      return "cannot checkpoint '" + key + "': it has " + std::to_string(tensor.size(0)) + " rows, but this rank's " +
             "shard of its parameter has " + std::to_string(shard->rows) +
             " (an optimizer built on the unsharded parameters? build it after ddp::fullyShard)";
    }
    to.emplace_back(key, tensor);
    if (rank == 0) {
      nlohmann::json rows = nlohmann::json::array();
      for (int r = 0; r < world; ++r) {
        const auto [start, end] = rowsOfRank(shard->fullShape[0], world, r);
        rows.push_back({start, end});
      }
      tensors[key] = {{"shape", shard->fullShape}, {"rows", rows}};
    }
  }
  return "";
}

}  // namespace

bool holdsShardedParameters(const torch::nn::Module& module) {
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (fsdp::shardOfParameter(item.value())) return true;
  }
  return false;
}

std::string saveShardedCheckpoint(ProcessGroup& group, const TrainingState& state, const torch::nn::Module& module,
                                  const std::string& dir) {
  const std::string path = shardedCheckpointPath(dir, state.globalStep);
  const std::string name = fs::path(path).filename().string();
  const std::string temporary = (fs::path(dir) / ("." + name + ".tmp")).string();
  const int rank = group.rank(), world = group.size();
  const auto params = shardedParameters(module);

  TrainingState mine = state;
  nlohmann::json tensors = nlohmann::json::object();
  std::string error = splitForRank(state.model, params, rank, world, mine.model, tensors);
  if (error.empty()) error = splitForRank(state.optimizer, params, rank, world, mine.optimizer, tensors);
  agree(group, error, "sharded checkpoint " + path);

  // Rank 0 makes the empty temporary directory; then every rank writes its file into it.
  if (rank == 0) {
    try {
      makeDirectories(dir, "ddp::CheckpointOptions::dir");
      std::error_code ec;
      fs::remove_all(temporary, ec);
      if (!fs::create_directory(temporary, ec) || ec) {
        DDP_THROW(CheckpointError, "cannot create '", temporary, "': ", ec.message());
      }
    } catch (const Error& e) {
      error = e.what();
    }
  }
  agree(group, error, "sharded checkpoint " + path);
  const std::string file = (fs::path(temporary) / rankFileName(rank)).string();
  try {
    if (!fs::is_directory(temporary)) {
      DDP_THROW(CheckpointError, "rank ", rank, " does not see '", temporary, "', which rank 0 made: ",
                "ddp::CheckpointOptions::dir", " must be one directory every rank shares (a shared filesystem across ",
                "hosts)");
    }
    saveTrainingCheckpoint(mine, file);
  } catch (const Error& e) {
    error = e.what();
  }
  agree(group, error, "sharded checkpoint " + path);

  // Rank 0: every file arrived (a shared directory), the manifest, then the directory in place.
  if (rank == 0) {
    try {
      nlohmann::json files = nlohmann::json::array();
      for (int r = 0; r < world; ++r) {
        const std::string f = (fs::path(temporary) / rankFileName(r)).string();
        std::error_code ec;
        const auto bytes = fs::file_size(f, ec);
        if (ec) {
          DDP_THROW(CheckpointError, "rank ", r, "'s file '", f, "' is not there as rank 0 sees it: ",
                    "ddp::CheckpointOptions::dir", " must be one directory every rank shares (a shared filesystem ",
                    "across hosts)");
        }
        files.push_back({{"name", rankFileName(r)}, {"bytes", bytes}});
      }
      const nlohmann::json manifest = {{"format", kShardedCheckpointFormat},
                                       {"world_size", world},
                                       {"global_step", state.globalStep},
                                       {"files", files},
                                       {"tensors", tensors}};
      writeFileAtomic((fs::path(temporary) / kShardedManifest).string(), manifest.dump(1));
      std::error_code ec;
      fs::remove_all(path, ec);  // this step written before (a resume from an older checkpoint)
      fs::rename(temporary, path, ec);
      if (ec) DDP_THROW(CheckpointError, "cannot rename '", temporary, "' to '", path, "': ", ec.message());
      fsyncDirectory(dir);
    } catch (const Error& e) {
      error = e.what();
      std::error_code ec;
      fs::remove_all(temporary, ec);
    }
  }
  agree(group, error, "sharded checkpoint " + path);
  return path;
}

TrainingState loadTrainingStateFor(const std::string& path, const torch::nn::Module* module) {
  const bool sharded = isShardedCheckpoint(path);
  nlohmann::json manifest;
  std::vector<std::string> files{path};
  if (sharded) {
    verifyShardedCheckpoint(path);
    manifest = readManifest(path);
    files.clear();
    for (const auto& f : manifest["files"]) files.push_back((fs::path(path) / f.value("name", "")).string());
    if (files.empty()) DDP_THROW(CheckpointError, "'", path, "': its manifest lists no files");
  }
  // Files read once each, and only those holding rows this rank needs.
  std::map<size_t, TrainingState> loaded;
  auto fileState = [&](size_t r) -> const TrainingState& {
    auto it = loaded.find(r);
    if (it == loaded.end()) it = loaded.emplace(r, loadTrainingCheckpoint(files[r])).first;
    return it->second;
  };
  TrainingState out = fileState(0);
  const auto params = module != nullptr ? shardedParameters(*module) : std::map<std::string, fsdp::ParameterShard>{};

  auto entryOf = [&](size_t r, const std::string& key, bool model) -> at::Tensor {
    const TrainingState& st = fileState(r);
    for (const auto& [k, t] : model ? st.model : st.optimizer) {
      if (k == key) return t;
    }
    return {};
  };
  auto resolve = [&](NamedTensors& entries, bool model) {
    for (auto& [key, first] : entries) {
      const nlohmann::json* saved = nullptr;
      if (sharded && manifest["tensors"].contains(key)) saved = &manifest["tensors"][key];
      const std::vector<int64_t> fullShape =
          saved ? (*saved)["shape"].get<std::vector<int64_t>>() : first.sizes().vec();
      const fsdp::ParameterShard* target = parameterOfKey(params, key, static_cast<int64_t>(fullShape.size()));
      if (target != nullptr && target->fullShape != fullShape) {
        DDP_THROW(CheckpointError, "'", path, "' holds '", key, "' of shape ", shapeText(fullShape),
                  ", but the model's is ", shapeText(target->fullShape),
                  "; resume with the model that wrote it (or start afresh with another checkpoint directory)");
      }
      const int64_t want0 = target ? target->rowStart : 0;
      const int64_t want1 = target ? target->rowStart + target->rows : (fullShape.empty() ? 0 : fullShape[0]);
      if (saved == nullptr) {  // whole in file 0
        if (target != nullptr) first = first.narrow(0, want0, want1 - want0).clone();
        continue;
      }
      std::vector<at::Tensor> pieces;
      const auto& rows = (*saved)["rows"];
      for (size_t r = 0; r < rows.size() && r < files.size(); ++r) {
        const int64_t start = rows[r][0].get<int64_t>(), end = rows[r][1].get<int64_t>();
        const int64_t lo = std::max(start, want0), hi = std::min(end, want1);
        if (lo >= hi) continue;
        const at::Tensor piece = r == 0 ? first : entryOf(r, key, model);
        if (!piece.defined() || piece.dim() == 0 || piece.size(0) != end - start) {
          DDP_THROW(CheckpointError, "'", files[r], "' does not hold rows ", start, "..", end, " of '", key,
                    "' as its manifest says (damaged, or another checkpoint's file)");
        }
        pieces.push_back(piece.narrow(0, lo - start, hi - lo));
      }
      if (pieces.empty()) {
        std::vector<int64_t> shape = fullShape;
        shape[0] = 0;
        first = at::empty(shape, first.options());
      } else {
        first = pieces.size() == 1 ? pieces[0].clone() : at::cat(pieces);
      }
    }
  };
  resolve(out.model, true);
  resolve(out.optimizer, false);
  return out;
}

}  // namespace ddp::checkpoint
