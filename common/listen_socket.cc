#include "common/listen_socket.h"

#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include <arpa/inet.h>
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

bool sameAddress(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof(x.sin6_addr)) == 0 && x.sin6_scope_id == y.sin6_scope_id;
  }
  return false;
}

void setPort(sockaddr_storage& address, int port) {
  if (address.ss_family == AF_INET) reinterpret_cast<sockaddr_in&>(address).sin_port = htons(static_cast<uint16_t>(port));
  if (address.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6&>(address).sin6_port = htons(static_cast<uint16_t>(port));
}

std::string addressText(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(address).sin_addr, text, sizeof(text));
    return text;
  }
  ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(address).sin6_addr, text, sizeof(text));
  return std::string("[") + text + "]";
}

// An address that is not this machine's, a family it lacks, or one it cannot bind as given (an IPv6
// link-local address without its interface): not the store's, skipped.
bool notHere(int error) { return error == EADDRNOTAVAIL || error == EAFNOSUPPORT || error == EINVAL; }

}  // namespace

struct ListenSocket::Candidate {
  sockaddr_storage address{};
  socklen_t length = 0;
  int family = 0, type = 0, protocol = 0;
};

std::vector<ListenSocket::Candidate> ListenSocket::resolve(const std::string& host, int port, int flags) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | flags;
  addrinfo* found = nullptr;
  const int status = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (status != 0) {
    DDP_THROW(ConfigError, "cannot listen on ", host, ":", port, ": '", host, "' does not resolve (",
              ::gai_strerror(status), "); give an address of this machine");
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(found, &::freeaddrinfo);
  std::vector<Candidate> out;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_addrlen > sizeof(sockaddr_storage)) continue;
    Candidate c;
    std::memcpy(&c.address, a->ai_addr, a->ai_addrlen);
    c.length = a->ai_addrlen;
    c.family = a->ai_family;
    c.type = a->ai_socktype;
    c.protocol = a->ai_protocol;
    out.push_back(c);
  }
  return out;
}

ListenSocket::ListenSocket(const std::string& host, int port) { bindAll(host, port, resolve(host, port, 0)); }

ListenSocket ListenSocket::onAddresses(const std::vector<std::string>& numericHosts, int port) {
  std::vector<Candidate> all;
  std::string host;
  for (const std::string& h : numericHosts) {
    const auto some = resolve(h, port, AI_NUMERICHOST);
    all.insert(all.end(), some.begin(), some.end());
    host += (host.empty() ? "" : ",") + h;
  }
  ListenSocket socket;
  socket.bindAll(host, port, all);
  return socket;
}

void ListenSocket::bindAll(const std::string& host, int port, const std::vector<Candidate>& candidates) {
  // Port 0: the kernel picks a port free on the first address only; one that is taken on another
  // address is no reason to refuse (nobody asked for it): pick again.
  for (int attempt = 0;; ++attempt) {
    const int held = tryBindAll(host, port, candidates);
    if (held == 0) return;
    if (port != 0 || attempt == 31) {
      DDP_THROW(ConfigError, "cannot listen on ", host, ":", port, ": '", host, "' is also ", guardText_,
                " here, where another socket holds port ", held, " (", std::strerror(EADDRINUSE),
                "): the ranks could reach it instead of the job's store; pick another --master_port, give one "
                "address as --master_addr, or (an earlier job's connections there still closing) wait a minute");
    }
  }
}

int ListenSocket::tryBindAll(const std::string& host, int port, const std::vector<Candidate>& candidates) {
  const std::string where = host + ":" + std::to_string(port);
  std::vector<sockaddr_storage> taken;
  int error = 0;
  for (const Candidate& candidate : candidates) {
    sockaddr_storage at = candidate.address;
    if (fd_ >= 0) setPort(at, port_);  // port 0: the others hold the port the kernel picked
    bool seen = false;
    for (const auto& t : taken) seen |= sameAddress(t, at);
    if (seen) continue;
    const int fd = ::socket(candidate.family, candidate.type | SOCK_CLOEXEC, candidate.protocol);
    if (fd < 0) {
      if (fd_ < 0) error = errno;
      continue;
    }
    if (fd_ < 0) {
      // Like c10d's TCPStore: a port whose old connections linger in TIME_WAIT can be bound again
      // (two live listeners on one port still cannot: Linux refuses the second).
      const int on = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
      if (::bind(fd, reinterpret_cast<const sockaddr*>(&at), candidate.length) == 0 && ::listen(fd, 1024) == 0) {
        fd_ = fd;
        port_ = portOf(fd);
        taken.push_back(at);
        continue;
      }
      error = errno;
      ::close(fd);
      if (notHere(error)) continue;
      break;  // in use: never on to an address the clients try after the one someone else holds
    }
    // Without SO_REUSEADDR nothing else can bind it while this is held; not listening, a client
    // that tries it is refused at once and tries the next address.
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&at), candidate.length) == 0) {
      guards_.push_back(fd);
      taken.push_back(at);
      continue;
    }
    const int guardError = errno;
    ::close(fd);
    if (notHere(guardError)) continue;
    const int held = port_;
    closeAll();
    if (guardError == EADDRINUSE) {
      guardText_ = addressText(at);
      return held;  // bindAll picks again (port 0) or says so
    }
    DDP_THROW(ConfigError, "cannot listen on ", where, ": '", host, "' is also ", addressText(at), " here, where ",
              "port ", held, " cannot be held (", std::strerror(guardError), "): the ranks could reach another "
              "process there instead of the job's store; pick another --master_port, or give one address as --master_addr");
  }
  if (fd_ >= 0) return 0;
  if (error == EADDRINUSE) {
    DDP_THROW(ConfigError, "cannot listen on ", where,
              " (address already in use); is another job using MASTER_PORT? Pick a free --master_port or let "
              "ddp-launch choose one");
  }
  if (notHere(error)) {
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

void ListenSocket::closeAll() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  for (int fd : guards_) ::close(fd);
  guards_.clear();
}

ListenSocket::~ListenSocket() { closeAll(); }

ListenSocket::ListenSocket(ListenSocket&& other) noexcept
    : fd_(other.fd_), port_(other.port_), guards_(std::move(other.guards_)) {
  other.fd_ = -1;
  other.guards_.clear();
}

int ListenSocket::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

}  // namespace ddp
