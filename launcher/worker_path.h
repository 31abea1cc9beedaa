// Finding the worker program before anything starts.
#pragma once

#include <string>

namespace ddp::launcher {

/// Resolves WORKER as execvp(3) would: a name with '/' is a path, a bare name is searched
/// on `pathEnv` (PATH). Returns the path to execute. Throws ddp::ConfigError naming the
/// problem (missing, a directory, not executable) so nothing is started.
std::string resolveWorkerPath(const std::string& worker, const std::string& pathEnv);

}  // namespace ddp::launcher
