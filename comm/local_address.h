// The address of this host that reaches a peer: what Gloo should bind for a
// multi-node job (loopback for a single-node one).
#pragma once

#include <string>

namespace ddp::comm {

/// The local IPv4 address the kernel routes to `peer` from (no packet is sent:
/// a connected UDP socket is only asked for its own name). "127.0.0.1" for a
/// loopback peer; throws CommError when `peer` does not resolve.
std::string localAddressFor(const std::string& peer);

}  // namespace ddp::comm
