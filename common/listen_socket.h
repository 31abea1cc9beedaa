// A listening TCP socket bound to one address: the job's store port, taken once and kept, so
// nothing can take it between a check and the bind, and bound only where the store is served.
#pragma once

#include <string>

namespace ddp {

/// Owns a listening socket (close-on-exec) bound to host:port (port 0: the kernel picks).
class ListenSocket {
 public:
  /// Throws ddp::ConfigError naming host:port and the cause ("address already in use",
  /// "not an address of this machine", a name that does not resolve).
  ListenSocket(const std::string& host, int port);
  /// Adopts `fd`, which must be a listening TCP socket; throws ddp::ConfigError otherwise.
  static ListenSocket adopt(int fd, const std::string& what);
  ~ListenSocket();
  ListenSocket(ListenSocket&& other) noexcept;
  ListenSocket& operator=(ListenSocket&&) = delete;
  ListenSocket(const ListenSocket&) = delete;
  ListenSocket& operator=(const ListenSocket&) = delete;

  int fd() const { return fd_; }
  int port() const { return port_; }
  /// Gives up ownership (the caller closes it).
  int release();

 private:
  ListenSocket() = default;
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace ddp
