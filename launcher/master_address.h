// Checking --master_addr before anything starts.
#pragma once

#include <string>

namespace ddp::launcher {

/// Resolves `host` (a name or an IP address) as every worker will; throws ddp::ConfigError
/// naming it when it does not resolve, so a typo fails at once instead of after the
/// rendezvous timeout. With `waitS` > 0 (a node other than rank 0's) a name that does not exist
/// yet is looked up again every second for up to `waitS` seconds, saying so once.
void checkMasterAddress(const std::string& host, double waitS = 0);

}  // namespace ddp::launcher
