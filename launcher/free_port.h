// Picking a TCP port for rank 0 when the user gave none.
#pragma once

#include <string>

namespace ddp::launcher {

/// Binds port 0 on `host` (the master address), reads the port the kernel chose and
/// closes the socket, so two jobs on one host get different ports. The port is free
/// now, not reserved: rank 0 must bind it soon. Throws ddp::ConfigError when `host`
/// does not resolve or is not an address of this machine.
int pickFreePort(const std::string& host);

}  // namespace ddp::launcher
