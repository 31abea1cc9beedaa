// Tier 2 test support: ranks as threads in one process, each a real Gloo
// process group over a real TCPStore on a free loopback port.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/process_group.h"
#include "comm/rendezvous.h"
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace ddp::comm::test {

/// A port that was free a moment ago. Racy (another process may take it before it is used):
/// only for tests that need a port nobody listens on; runRanks() does not use it.
inline uint16_t freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

/// Runs `body(comm)` on `world` threads, each a rank of a fresh group of
/// `backend` (Gloo or shared memory); any rank's exception fails the test with its message.
inline void runRanks(int world, const std::function<void(Communicator&)>& body,
                     Backend backend = Backend::kGloo) {
  // The test hosts the store on a port the kernel picks (0) and keeps it bound, as torchrun's
  // agent does; every rank joins as a client. No window where another process can take the port.
  c10d::TCPStoreOptions server;
  server.port = 0;
  server.isServer = true;
  server.waitWorkers = false;
  server.timeout = std::chrono::seconds(30);
  auto host = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", server);
  const uint16_t port = host->getPort();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        RendezvousOptions rdv;
        rdv.masterPort = port;
        rdv.storeServedElsewhere = true;
        rdv.rank = r;
        rdv.worldSize = world;
        rdv.timeout = std::chrono::seconds(30);
        auto store = rendezvous(rdv);
        ProcessGroupOptions pg;
        pg.rank = r;
        pg.worldSize = world;
        pg.backend = backend;
        pg.timeout = std::chrono::seconds(30);
        auto comm = makeCommunicator(store, pg);
        body(*comm);
        comm->barrier();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace ddp::comm::test
