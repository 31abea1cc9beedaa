#include "launcher/master_address.h"

#include <netdb.h>
#include <sys/socket.h>

#include <chrono>
#include <thread>

#include <spdlog/spdlog.h>

#include "common/error.h"

namespace ddp::launcher {
namespace {

int resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int status = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (status == 0) ::freeaddrinfo(found);
  return status;
}

}  // namespace

void checkMasterAddress(const std::string& host, double waitS) {
  int status = resolve(host);
  if (status == 0) return;
  // A name that may appear: a Kubernetes pod's DNS name exists once the pod runs, and another
  // node's launcher may start first (torchrun retries until its rendezvous timeout too).
#ifdef EAI_NODATA
  const bool noData = status == EAI_NODATA;  // a GNU extension
#else
  const bool noData = false;
#endif
  const bool mayAppear = waitS > 0 && (status == EAI_NONAME || status == EAI_AGAIN || noData);
  if (mayAppear) {
    spdlog::info("--master_addr '{}' does not resolve yet ({}); waiting up to {:.0f} s for it (the node of rank 0 "
                 "may not have started: a pod's DNS name exists once it runs)", host, ::gai_strerror(status), waitS);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(waitS);
    while (status != 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::seconds(1));  // polling the resolver, not synchronising
      status = resolve(host);
    }
    if (status == 0) {
      spdlog::info("--master_addr '{}' resolves now", host);
      return;
    }
  }
  DDP_THROW(ConfigError, "--master_addr '", host, "' cannot be resolved (", ::gai_strerror(status), ")",
            mayAppear ? " after waiting " + std::to_string(static_cast<long>(waitS)) + " s" : std::string(),
            "; give the host name or IP address of the node that runs rank 0, e.g. --master_addr=127.0.0.1");
}

}  // namespace ddp::launcher
