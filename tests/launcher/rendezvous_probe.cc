// Test worker for concurrent launches: rank 0 listens on MASTER_ADDR:MASTER_PORT, on the socket
// ddp-launch bound there and handed over (DDP_STORE_FD), else binding it itself without
// SO_REUSEADDR (so a port two jobs share fails loudly); every other rank connects and swaps one
// byte with it. Exit 0 only if all of WORLD_SIZE took part.
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace {

constexpr auto kDeadline = std::chrono::seconds(20);

std::string env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) {
    std::fprintf(stderr, "probe: %s is not set\n", name);
    std::exit(20);
  }
  return value;
}

addrinfo* resolve(const std::string& host, const std::string& port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &result) != 0) {
    std::fprintf(stderr, "probe: cannot resolve %s:%s\n", host.c_str(), port.c_str());
    std::exit(21);
  }
  return result;
}

int serve(const std::string& host, const std::string& port, int worldSize) {
  const char* handed = std::getenv("DDP_STORE_FD");
  addrinfo* address = handed ? nullptr : resolve(host, port);
  const int listener = handed ? std::atoi(handed) : ::socket(address->ai_family, SOCK_STREAM, 0);
  if (!handed &&
      (::bind(listener, address->ai_addr, address->ai_addrlen) != 0 || ::listen(listener, worldSize) != 0)) {
    std::fprintf(stderr, "probe: rank 0 cannot listen on %s:%s: %s\n", host.c_str(), port.c_str(),
                 std::strerror(errno));
    return 10;
  }
  std::printf("listening on %s:%s\n", host.c_str(), port.c_str());
  std::fflush(stdout);
  std::set<int> peers;
  while (static_cast<int>(peers.size()) < worldSize - 1) {
    pollfd ready{listener, POLLIN, 0};
    if (::poll(&ready, 1, static_cast<int>(std::chrono::milliseconds(kDeadline).count())) != 1) {
      std::fprintf(stderr, "probe: rank 0 saw only %zu of %d peers\n", peers.size(), worldSize - 1);
      return 11;
    }
    const int peer = ::accept(listener, nullptr, nullptr);
    unsigned char rank = 0;
    if (peer < 0 || ::read(peer, &rank, 1) != 1 || rank == 0 || rank >= worldSize || !peers.insert(rank).second) {
      std::fprintf(stderr, "probe: rank 0 got a bad hello (rank %d)\n", rank);
      return 12;
    }
    const unsigned char reply = static_cast<unsigned char>(rank + 100);
    if (::write(peer, &reply, 1) != 1) return 13;
    ::close(peer);
  }
  return 0;
}

int join(const std::string& host, const std::string& port, int rank) {
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  addrinfo* address = resolve(host, port);
  while (true) {
    const int fd = ::socket(address->ai_family, SOCK_STREAM, 0);
    if (::connect(fd, address->ai_addr, address->ai_addrlen) == 0) {
      const unsigned char hello = static_cast<unsigned char>(rank);
      unsigned char reply = 0;
      if (::write(fd, &hello, 1) != 1 || ::read(fd, &reply, 1) != 1 || reply != rank + 100) {
        std::fprintf(stderr, "probe: rank %d got a bad reply %d\n", rank, reply);
        return 14;
      }
      return 0;
    }
    ::close(fd);
    if (std::chrono::steady_clock::now() >= deadline) {
      std::fprintf(stderr, "probe: rank %d could not connect to %s:%s\n", rank, host.c_str(), port.c_str());
      return 15;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

int main() {
  const int rank = std::atoi(env("RANK").c_str());
  const int worldSize = std::atoi(env("WORLD_SIZE").c_str());
  const std::string host = env("MASTER_ADDR");
  const std::string port = env("MASTER_PORT");
  return rank == 0 ? serve(host, port, worldSize) : join(host, port, rank);
}
