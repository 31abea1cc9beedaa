// Tier 2 test support: ranks as threads in one process, each a real Gloo
// process group over a real TCPStore on a kernel-chosen loopback port.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/process_group.h"
#include "comm/rendezvous.h"
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace ddp::comm::test {

/// A TCPStore server on a port the kernel picks (0), kept bound for the test: it stands in for
/// torchrun's agent store, and the ranks join as clients (RendezvousOptions::storeServedElsewhere).
inline c10::intrusive_ptr<c10d::TCPStore> hostStore() {
  c10d::TCPStoreOptions server;
  server.port = 0;
  server.isServer = true;
  server.waitWorkers = false;
  server.timeout = std::chrono::seconds(30);
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", server);
}

/// Runs `body(comm)` on `world` threads, each a rank of a fresh group of
/// `backend` (Gloo or shared memory); any rank's exception fails the test with its message.
inline void runRanks(int world, const std::function<void(Communicator&)>& body,
                     Backend backend = Backend::kGloo) {
  // The test hosts the store on a port the kernel picks (0) and keeps it bound, as torchrun's
  // agent does; every rank joins as a client. No window where another process can take the port.
  auto host = hostStore();
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
        comm->barrier()->wait();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace ddp::comm::test
