#include "launcher/free_port.h"

#include <cerrno>
#include <cstring>
#include <memory>

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/error.h"

namespace ddp::launcher {
namespace {

int boundPort(const addrinfo& address, std::string& error) {
  const int fd = ::socket(address.ai_family, address.ai_socktype | SOCK_CLOEXEC, address.ai_protocol);
  if (fd < 0) {
    error = std::strerror(errno);
    return 0;
  }
  // No SO_REUSEADDR: the probe must fail exactly when a listener could not bind.
  int port = 0;
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  if (::bind(fd, address.ai_addr, address.ai_addrlen) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
    error = std::strerror(errno);
  } else if (bound.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in&>(bound).sin_port);
  } else if (bound.ss_family == AF_INET6) {
    port = ntohs(reinterpret_cast<const sockaddr_in6&>(bound).sin6_port);
  }
  ::close(fd);
  return port;
}

}  // namespace

int pickFreePort(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int status = ::getaddrinfo(host.c_str(), "0", &hints, &found);
  if (status != 0) {
    DDP_THROW(ConfigError, "--master_addr '", host, "' does not resolve (", ::gai_strerror(status),
              "); give an address of this machine, e.g. --master_addr=127.0.0.1");
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, &::freeaddrinfo);
  std::string error = "no address";
  for (const addrinfo* address = found; address != nullptr; address = address->ai_next) {
    const int port = boundPort(*address, error);
    if (port > 0) return port;
  }
  DDP_THROW(ConfigError, "cannot pick a free port on --master_addr '", host, "' (bind: ", error,
            "); with --nnodes=1 it must be an address of this machine, or give --master_port");
}

}  // namespace ddp::launcher
