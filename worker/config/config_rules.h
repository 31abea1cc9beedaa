// The rules a resolved WorkerConfig must meet (worker/config/config_rules.cc).
#pragma once

#include "worker/config/config.h"

namespace ddp::worker {

/// Throws ConfigError, one line naming the key and the fix, at the first rule `c` breaks; the
/// sections in a fixed order, so of two mistakes the same one is reported first.
void validateConfig(const WorkerConfig& c);

}  // namespace ddp::worker
