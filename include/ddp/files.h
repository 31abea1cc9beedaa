// Files a reader never sees half-written (a killed job, a full disk): what the library's own exports
// and checkpoints use, for a program's own outputs (a summary, a resolved config, a metrics file).
#pragma once

#include <string>
#include <string_view>

namespace ddp {

/// Writes `bytes` to `path` so that a reader finds the old file, the new one or none, never a part
/// of one: a temporary file beside it, fsync, rename over `path`, fsync of the directory.
/// Temporaries left by a killed writer are removed. Throws CheckpointError naming the path and the
/// system's reason (no space, no permission, no such directory).
void writeFileAtomic(const std::string& path, std::string_view bytes);

/// Creates `dir` and its parents (nothing to do when it exists). On failure a ConfigError:
/// "<settingName>: cannot create directory '<dir>': <reason>; set <settingName> to a writable
/// path", with `settingName` how your program's user sets it (an option or a config key).
void makeDirectories(const std::string& dir, const std::string& settingName = "the directory");

}  // namespace ddp
