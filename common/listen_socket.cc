#include "common/listen_socket.h"

#include <cerrno>
#include <cstring>
#include <memory>

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/error.h"

namespace ddp {
namespace {

int portOf(int fd) {
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) return 0;
  if (bound.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(bound).sin_port);
  if (bound.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(bound).sin6_port);
  return 0;
}

}  // namespace

ListenSocket::ListenSocket(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string where = host + ":" + std::to_string(port);
  const int status = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (status != 0) {
    DDP_THROW(ConfigError, "cannot listen on ", where, ": '", host, "' does not resolve (", ::gai_strerror(status),
              "); give an address of this machine");
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, &::freeaddrinfo);
  int error = 0;
  for (const addrinfo* address = found; address != nullptr; address = address->ai_next) {
    const int fd = ::socket(address->ai_family, address->ai_socktype | SOCK_CLOEXEC, address->ai_protocol);
    if (fd < 0) {
      error = errno;
      continue;
    }
    // Like c10d's TCPStore: a port whose old connections linger in TIME_WAIT can be bound again
    // (two live listeners on one port still cannot: Linux refuses the second).
    const int on = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (::bind(fd, address->ai_addr, address->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      fd_ = fd;
      port_ = portOf(fd);
      return;
    }
    error = errno;
    ::close(fd);
  }
  if (error == EADDRINUSE) {
    DDP_THROW(ConfigError, "cannot listen on ", where,
              " (address already in use); is another job using MASTER_PORT? Pick a free --master_port or let "
              "ddp-launch choose one");
  }
  if (error == EADDRNOTAVAIL) {
    DDP_THROW(ConfigError, "cannot listen on ", where, ": '", host,
              "' is not an address of this machine; rank 0's host serves the job's store there, so give its "
              "own address (or the address to bind with --rdzv_bind / DDP_RDZV_BIND)");
  }
  DDP_THROW(ConfigError, "cannot listen on ", where, " (", std::strerror(error), ")");
}

ListenSocket ListenSocket::adopt(int fd, const std::string& what) {
  int listening = 0;
  socklen_t length = sizeof(listening);
  int type = 0;
  socklen_t typeLength = sizeof(type);
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) != 0 || !listening ||
      ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &typeLength) != 0 || type != SOCK_STREAM || portOf(fd) == 0) {
    DDP_THROW(ConfigError, what, "=", fd, " is not a listening TCP socket of this process; unset ", what,
              " (ddp-launch sets it for rank 0 only)");
  }
  ListenSocket socket;
  socket.fd_ = fd;
  socket.port_ = portOf(fd);
  return socket;
}

ListenSocket::~ListenSocket() {
  if (fd_ >= 0) ::close(fd_);
}

ListenSocket::ListenSocket(ListenSocket&& other) noexcept : fd_(other.fd_), port_(other.port_) { other.fd_ = -1; }

int ListenSocket::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

}  // namespace ddp
