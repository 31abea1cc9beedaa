#include "libddp/checkpoint/sharded_checkpoint.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <fcntl.h>
#include <torch/nn/module.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
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

// Every rank's file's checksum, on every rank (rank r fills slot r: a sum is a gather). The
// manifest records them, so a file swapped between ranks or copied from another checkpoint, of the
// right size, is refused at load.
std::vector<uint32_t> gatherChecksums(ProcessGroup& group, const TrainingState& mine) {
  at::Tensor all = at::zeros({group.size()}, at::kLong);
  all[group.rank()].fill_(static_cast<int64_t>(checksumOf(mine)));
  all = all.to(group.collectiveDevice());
  group.allReduce(all);
  all = all.cpu();
  std::vector<uint32_t> out;
  for (int r = 0; r < group.size(); ++r) out.push_back(static_cast<uint32_t>(all[r].item<int64_t>()));
  return out;
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

namespace {

// Moves the finished directory `from` to `to`. A checkpoint of the same step written before (a
// resume from an older one) is replaced without a moment where neither is there: the two swap
// names in one step (renameat2's RENAME_EXCHANGE), then the old one, now at `from`, is removed.
// Where the filesystem cannot swap (EINVAL: NFS, some FUSE) the old one is moved aside first, to
// a name pruneCheckpoints removes.
void putInPlace(const std::string& from, const std::string& to) {
  std::error_code ec;
  auto renameOrThrow = [](const std::string& a, const std::string& b) {
    std::error_code e;
    fs::rename(a, b, e);
    if (e) DDP_THROW(CheckpointError, "cannot rename '", a, "' to '", b, "': ", e.message());
  };
  if (!fs::exists(to, ec)) {
    renameOrThrow(from, to);
    return;
  }
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(from, ec);
    return;
  }
  if (errno != EINVAL && errno != ENOSYS) {
    DDP_THROW(CheckpointError, "cannot put '", from, "' in place of '", to, "': ", std::strerror(errno));
  }
  const std::string aside = from + ".old";
  fs::remove_all(aside, ec);
  renameOrThrow(to, aside);
  try {
    renameOrThrow(from, to);
  } catch (const CheckpointError&) {
    fs::rename(aside, to, ec);  // the old one back
    throw;
  }
  fs::remove_all(aside, ec);
}

}  // namespace

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
  const std::vector<uint32_t> checksums = gatherChecksums(group, mine);

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
        char checksum[24];
        std::snprintf(checksum, sizeof checksum, "crc32:%08x", checksums[static_cast<size_t>(r)]);
        files.push_back({{"name", rankFileName(r)}, {"bytes", bytes}, {"checksum", checksum}});
      }
      const nlohmann::json manifest = {{"format", kShardedCheckpointFormat},
                                       {"world_size", world},
                                       {"global_step", state.globalStep},
                                       {"files", files},
                                       {"tensors", tensors}};
      writeFileAtomic((fs::path(temporary) / kShardedManifest).string(), manifest.dump(1));
      putInPlace(temporary, path);
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

namespace {

// One file of a checkpoint, read once, its entries by key.
struct RankFile {
  TrainingState state;
  std::map<std::string, at::Tensor> model, optimizer;
};

// The files of a checkpoint (a sharded directory's, or the one file), each read at its first use
// and checked against the manifest: the step and world size it records, and its checksum where the
// manifest holds one (a file swapped between ranks or copied from another checkpoint has the right
// size but not the checksum).
class CheckpointFiles {
 public:
  explicit CheckpointFiles(const std::string& path) : sharded_(isShardedCheckpoint(path)) {
    if (!sharded_) {
      refuseRankFile(path);
      paths_ = {path};
      return;
    }
    try {
      verifyShardedCheckpoint(path);
      manifest_ = readManifest(path);
    } catch (const CheckpointError& e) {
      throw DamagedCheckpoint(e.what());
    }
    for (const auto& f : manifest_["files"]) {
      paths_.push_back((fs::path(path) / f["name"].get<std::string>()).string());
      checksums_.push_back(f.value("checksum", std::string()));
    }
  }

  size_t size() const { return paths_.size(); }
  const std::string& path(size_t r) const { return paths_[r]; }
  // The manifest's entry of a sharded tensor, nullptr for one that file 0 holds whole.
  const nlohmann::json* saved(const std::string& key) const {
    if (!sharded_) return nullptr;
    const auto it = manifest_["tensors"].find(key);
    return it == manifest_["tensors"].end() ? nullptr : &*it;
  }

  const RankFile& file(size_t r) {
    auto it = files_.find(r);
    if (it != files_.end()) return it->second;
    RankFile f;
    try {
      f.state = loadTrainingCheckpoint(paths_[r]);
      if (sharded_) checkBelongs(r, f.state);
    } catch (const CheckpointError& e) {
      throw DamagedCheckpoint(e.what());
    } catch (const std::exception& e) {  // LibTorch's reader on a damaged archive: its first line
      const std::string what = e.what();
      DDP_THROW(DamagedCheckpoint, "cannot read '", paths_[r], "': ", what.substr(0, what.find('\n')));
    }
    for (const auto& [key, t] : f.state.model) f.model.emplace(key, t);
    for (const auto& [key, t] : f.state.optimizer) f.optimizer.emplace(key, t);
    return files_.emplace(r, std::move(f)).first->second;
  }

 private:
  // A rank's file given as the checkpoint: it holds that rank's rows only.
  static void refuseRankFile(const std::string& path) {
    static const std::regex kRankFile(R"(rank-\d{5}\.pt)");
    const fs::path p(path);
    std::error_code ec;
    if (std::regex_match(p.filename().string(), kRankFile) && p.has_parent_path() &&
        fs::exists(p.parent_path() / kShardedManifest, ec)) {
      DDP_THROW(CheckpointError, "'", path, "' is one rank's part of the sharded checkpoint '", p.parent_path().string(),
                "'; resume from that directory");
    }
  }

  void checkBelongs(size_t r, const TrainingState& state) const {
    const auto step = manifest_["global_step"].get<int64_t>();
    const auto world = manifest_["world_size"].get<int64_t>();
    if (state.globalStep != step || state.worldSize != world) {
      DDP_THROW(CheckpointError, "'", paths_[r], "' was written at step ", state.globalStep, " by ", state.worldSize,
                " ranks, but its manifest is of step ", step, " by ", world, " ranks: a file of another checkpoint; ",
                "restore this checkpoint's own files or resume from another checkpoint");
    }
    char computed[24];
    std::snprintf(computed, sizeof computed, "crc32:%08x", checksumOf(state));
    if (!checksums_[r].empty() && checksums_[r] != computed) {
      DDP_THROW(CheckpointError, "'", paths_[r], "' is not the file its manifest lists (checksum ", computed,
                ", the manifest's ", checksums_[r], "): a rank's file swapped with another's or copied from another ",
                "checkpoint; restore this checkpoint's own files or resume from another checkpoint");
    }
  }

  bool sharded_;
  nlohmann::json manifest_;
  std::vector<std::string> paths_;
  std::vector<std::string> checksums_;  // "" where the manifest holds none (written before it did)
  std::map<size_t, RankFile> files_;
};

// The rows [want0, want1) of the sharded tensor `key` (the manifest's entry `saved`), from the
// files that hold them; `first` is file 0's entry.
at::Tensor assembleRows(CheckpointFiles& files, const nlohmann::json& saved, const std::string& key, bool model,
                        const at::Tensor& first, int64_t want0, int64_t want1) {
  std::vector<at::Tensor> pieces;
  const auto& rows = saved["rows"];
  for (size_t r = 0; r < rows.size() && r < files.size(); ++r) {
    const int64_t start = rows[r][0].get<int64_t>(), end = rows[r][1].get<int64_t>();
    const int64_t lo = std::max(start, want0), hi = std::min(end, want1);
    if (lo >= hi) continue;
    at::Tensor piece = first;
    if (r != 0) {
      const auto& entries = model ? files.file(r).model : files.file(r).optimizer;
      const auto it = entries.find(key);
      piece = it == entries.end() ? at::Tensor() : it->second;
    }
    if (!piece.defined() || piece.dim() == 0 || piece.size(0) != end - start) {
      DDP_THROW(DamagedCheckpoint, "'", files.path(r), "' does not hold rows ", start, "..", end, " of '", key,
                "' as its manifest says (damaged, or another checkpoint's file)");
    }
    pieces.push_back(piece.narrow(0, lo - start, hi - lo));
  }
  if (pieces.empty()) {
    std::vector<int64_t> shape = saved["shape"].get<std::vector<int64_t>>();
    shape[0] = 0;
    return at::empty(shape, first.options());
  }
  return pieces.size() == 1 ? pieces[0].clone() : at::cat(pieces);
}

}  // namespace

TrainingState loadTrainingStateFor(const std::string& path, const torch::nn::Module* module) {
  CheckpointFiles files(path);
  TrainingState out = files.file(0).state;
  const auto params = module != nullptr ? shardedParameters(*module) : std::map<std::string, fsdp::ParameterShard>{};
  auto resolve = [&](NamedTensors& entries, bool model) {
    for (auto& [key, first] : entries) {
      const nlohmann::json* saved = files.saved(key);
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
      first = assembleRows(files, *saved, key, model, first, want0, want1);
    }
  };
  resolve(out.model, true);
  resolve(out.optimizer, false);
  return out;
}

}  // namespace ddp::checkpoint
