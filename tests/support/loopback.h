// Loopback sockets for tests: a free port number, a listener, a connection, and a port that
// refuses connections. IPv4 127.0.0.1 only, as the single-host tests use.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

namespace ddp::test {

/// 127.0.0.1:port as the socket calls take it.
inline sockaddr_in loopbackAddress(uint16_t port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return address;
}

/// A TCP socket bound to 127.0.0.1:port (0: the kernel picks), not listening; -1 when the port
/// is taken. Inherited by the programs a test starts, as a plain socket() is.
inline int bindLoopback(uint16_t port = 0) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in address = loopbackAddress(port);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// The local address `fd` is bound to (all zero when it is not a bound IPv4 socket).
inline sockaddr_in boundAddress(int fd) {
  sockaddr_in address{};
  socklen_t length = sizeof address;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return sockaddr_in{};
  return address;
}

/// The local port `fd` is bound to (0 when it is not a bound socket).
inline uint16_t boundPort(int fd) { return ntohs(boundAddress(fd).sin_port); }

/// A listener on 127.0.0.1:port (0: the kernel picks; boundPort() says which); -1 when the port
/// cannot be taken.
inline int listenLoopback(uint16_t port = 0, int backlog = 4) {
  const int fd = bindLoopback(port);
  if (fd >= 0 && ::listen(fd, backlog) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// A loopback port the kernel just chose and released: free unless another process races for it
/// (for programs that need a port number up front and bind it themselves).
inline uint16_t freePort() {
  const int fd = bindLoopback(0);
  const uint16_t port = fd >= 0 ? boundPort(fd) : 0;
  if (fd >= 0) ::close(fd);
  return port;
}

/// A blocking connection to 127.0.0.1:port, closed on exec; -1 when refused.
inline int connectLoopback(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address = loopbackAddress(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// A loopback port held bound but not listening for the object's lifetime: connecting to it is
/// refused, and no other process can take it meanwhile (a released "free" port could be).
class SilentPort {
 public:
  SilentPort() : fd_(bindLoopback(0)) {
    if (fd_ < 0) {
      ADD_FAILURE() << "could not bind a loopback port";
      return;
    }
    port_ = boundPort(fd_);
  }
  ~SilentPort() {
    if (fd_ >= 0) ::close(fd_);
  }
  SilentPort(const SilentPort&) = delete;
  SilentPort& operator=(const SilentPort&) = delete;
  uint16_t port() const { return port_; }

 private:
  int fd_;
  uint16_t port_ = 0;
};

}  // namespace ddp::test
