// The job's key-value store server: what c10d's TCPStore is to torch.distributed, plus what it
// lacks: it serves only the socket it is given (bound to one address), admits a client only after
// a challenge-response on the job's token, and sheds connections that never authenticate.
// No LibTorch here: plain sockets and one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace ddp::comm {

struct StoreServerOptions {
  /// The job's token; empty: no authentication (the server says so, and clients without a token join).
  std::string token;
  /// A connection that has not authenticated within this is closed.
  std::chrono::milliseconds handshakeTimeout{5000};
  /// Connections still in their handshake beyond this many: the oldest is closed (floods).
  std::size_t maxUnauthenticated = 64;
  /// Kept until the server is destroyed: the ListenSocket whose fd it serves, for the port it
  /// holds on the host's other addresses.
  std::shared_ptr<const void> keepAlive;
};

struct StoreServerStats {
  std::uint64_t admitted = 0;      // clients that proved the token
  std::uint64_t rejected = 0;      // wrong token or malformed handshake
  std::uint64_t timedOut = 0;      // closed for not finishing the handshake in time
  std::uint64_t shed = 0;          // closed to make room for newer unauthenticated ones
  std::uint64_t badRequests = 0;   // admitted clients that sent a malformed frame (closed)
};

class StoreServer {
 public:
  /// Serves on `listenFd` (a listening TCP socket; the server owns and closes it) from a thread
  /// of its own until destroyed.
  StoreServer(int listenFd, StoreServerOptions options);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  StoreServerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp::comm
