#include "launcher/master_address.h"

#include <netdb.h>
#include <sys/socket.h>

#include "common/error.h"

namespace ddp::launcher {

void checkMasterAddress(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int status = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (status == 0) {
    ::freeaddrinfo(found);
    return;
  }
  DDP_THROW(ConfigError, "--master_addr '", host, "' cannot be resolved (", ::gai_strerror(status),
            "); give the host name or IP address of the node that runs rank 0, e.g. --master_addr=127.0.0.1");
}

}  // namespace ddp::launcher
