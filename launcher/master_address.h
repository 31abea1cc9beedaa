// Checking --master_addr before anything starts.
#pragma once

#include <string>

namespace ddp::launcher {

/// Resolves `host` (a name or an IP address) as every worker will; throws ddp::ConfigError
/// naming it when it does not resolve, so a typo fails at once instead of after the
/// rendezvous timeout.
void checkMasterAddress(const std::string& host);

}  // namespace ddp::launcher
