// Files that are either absent, the old version, or complete: never half-written.
#pragma once

#include <string>
#include <string_view>

namespace ddp::checkpoint {

/// Writes `bytes` to `path` via a temporary file in the same directory,
/// fsync, rename, and fsync of the directory. Throws CheckpointError.
void writeFileAtomic(const std::string& path, std::string_view bytes);

/// Creates `dir` and its parents; throws ConfigError naming the path and `key`, the config
/// key that set it, on failure.
void makeDirectories(const std::string& dir, const std::string& key = "output.dir");

}  // namespace ddp::checkpoint
