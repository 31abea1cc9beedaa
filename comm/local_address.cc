#include "comm/local_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "common/error.h"

namespace ddp::comm {

std::string localAddressFor(const std::string& peer) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(peer.c_str(), "9", &hints, &found) != 0 || found == nullptr) {
    DDP_THROW(CommError, "MASTER_ADDR '", peer, "' does not resolve to an IPv4 address; pass --master_addr as an address or a resolvable name");
  }
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  std::string out;
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    char text[INET_ADDRSTRLEN] = {0};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text) != nullptr) {
      out = text;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  if (out.empty()) DDP_THROW(CommError, "no route from this host to MASTER_ADDR ", peer);
  return out;
}

}  // namespace ddp::comm
