// The job's store as ranks use it (comm/ddp_store over common/store_server): its operations against
// LibTorch's own TCPStore (the reference: same calls, same answers), the attacks it must shrug off,
// and the shm backend's segment check. common/'s hashing and sockets: tests/common/security_test.cc.
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/ddp_store.h"
#include "comm/shm_communicator.h"
#include "common/store_client.h"
#include "common/store_server.h"
#include "common/store_wire.h"
#include "common/job_token.h"
#include "common/listen_socket.h"
#include "tests/support/loopback.h"

namespace ddp::comm {
namespace {

using Bytes = std::vector<uint8_t>;
Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string text(const Bytes& b) { return std::string(b.begin(), b.end()); }

// --- the store --------------------------------------------------------------------------------

constexpr const char* kToken = "0123456789abcdef0123456789abcdef";

struct Served {
  std::unique_ptr<StoreServer> server;
  int port = 0;
};

Served serve(const std::string& token = kToken, StoreServerOptions options = {}) {
  ListenSocket socket("127.0.0.1", 0);
  Served s;
  s.port = socket.port();
  options.token = token;
  s.server = std::make_unique<StoreServer>(socket.release(), options);
  return s;
}

c10::intrusive_ptr<DdpStore> client(int port, const std::string& token = kToken,
                                    std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  DdpStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.token = token;
  o.timeout = timeout;
  return c10::make_intrusive<DdpStore>(o);
}

// Runs the same calls on a store and returns what each answered (an exception reads "threw").
std::vector<std::string> script(c10d::Store& store) {
  std::vector<std::string> out;
  auto record = [&out](auto&& call) {
    try {
      out.push_back(call());
    } catch (const std::exception&) {
      out.push_back("threw");
    }
  };
  const int64_t keysBefore = store.getNumKeys();
  record([&] { store.set("a", bytes("one")); return std::string("set"); });
  record([&] { return text(store.get("a")); });
  record([&] { store.set("a", bytes("two")); return text(store.get("a")); });
  record([&] { return std::to_string(store.add("n", 5)); });
  record([&] { return std::to_string(store.add("n", -2)); });
  record([&] { return std::to_string(store.add("n", 0)); });
  record([&] { return text(store.get("n")); });  // counters are decimal text
  record([&] { return std::to_string(store.check({"a", "n"})); });
  record([&] { return std::to_string(store.check({"a", "missing"})); });
  record([&] { return text(store.compareSet("cas", bytes(""), bytes("first"))); });      // missing, empty expected
  record([&] { return text(store.compareSet("cas", bytes("wrong"), bytes("second"))); });  // mismatch
  record([&] { return text(store.compareSet("cas", bytes("first"), bytes("third"))); });   // match
  record([&] { return text(store.compareSet("gone", bytes("x"), bytes("y"))); });          // missing, expected given
  record([&] { return std::to_string(store.check({"gone"})); });
  record([&] { return std::to_string(store.getNumKeys() - keysBefore); });
  record([&] { return std::to_string(store.deleteKey("a")); });
  record([&] { return std::to_string(store.deleteKey("a")); });
  record([&] { return std::to_string(store.check({"a"})); });
  record([&] { store.wait({"n", "cas"}); return std::string("waited"); });
  record([&] { store.wait({"never"}, std::chrono::milliseconds(200)); return std::string("waited"); });
  record([&] { return std::to_string(store.getNumKeys() - keysBefore); });
  return out;
}

TEST(DdpStore, AnswersEveryCallAsLibTorchsTCPStoreDoes) {
  c10d::TCPStoreOptions server;
  server.port = 0;
  server.isServer = true;
  server.waitWorkers = false;
  server.timeout = std::chrono::seconds(10);
  auto reference = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", server);
  Served ours = serve();
  auto store = client(ours.port);
  const auto expected = script(*reference);
  const auto got = script(*store);
  // The reference itself answered (not every call threw): a few answers follow from the calls.
  ASSERT_EQ(expected.size(), 21u);
  EXPECT_EQ(expected[1], "one");
  EXPECT_EQ(expected[5], "3");
  EXPECT_EQ(expected[19], "threw");  // the wait for a key nobody sets
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[i]) << "call " << i;
}

TEST(DdpStore, AGetWaitsForAKeyAnotherClientSets) {
  Served s = serve();
  auto reader = client(s.port);
  auto writer = client(s.port);
  std::string seen;
  std::thread waiting([&] { seen = text(reader->get("late")); });
  writer->set("late", bytes("here"));
  waiting.join();
  EXPECT_EQ(seen, "here");
}

TEST(DdpStore, AGetOfAMissingKeyEndsAtTheStoresTimeout) {
  Served s = serve();
  auto store = client(s.port, kToken, std::chrono::milliseconds(300));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(store->get("never"), TimeoutError);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300));
  EXPECT_EQ(text((store->set("k", bytes("v")), store->get("k"))), "v");  // still usable after a timeout
}

TEST(DdpStore, AWrongOrMissingTokenIsRejectedAndTheJobCarriesOn) {
  Served s = serve();
  auto job = client(s.port);
  job->set("secret", bytes("weights"));
  try {
    client(s.port, "fedcba9876543210fedcba9876543210");
    FAIL() << "a wrong token was admitted";
  } catch (const StoreAuthError& e) {
    EXPECT_NE(std::string(e.what()).find("rejected this rank's token"), std::string::npos) << e.what();
  }
  try {
    client(s.port, "");
    FAIL() << "a client without a token was admitted";
  } catch (const StoreAuthError& e) {
    EXPECT_NE(std::string(e.what()).find("needs the job's token"), std::string::npos) << e.what();
  }
  EXPECT_EQ(text(job->get("secret")), "weights");
  EXPECT_EQ(s.server->stats().rejected, 2u);
  EXPECT_EQ(s.server->stats().admitted, 1u);
}

TEST(DdpStore, ARankRefusesAStoreThatCannotProveTheToken) {
  // A server without a token (another job's, or an impostor's) admits anyone: a rank with a token
  // must not trust it.
  Served open = serve("");
  try {
    client(open.port);
    FAIL() << "a rank trusted a store that asks for no token";
  } catch (const StoreAuthError& e) {
    EXPECT_NE(std::string(e.what()).find("asks for no token"), std::string::npos) << e.what();
  }
  // An impostor that claims to check tokens and accepts without proof.
  ListenSocket socket("127.0.0.1", 0);
  std::thread impostor([fd = socket.fd()] {
    const int peer = ::accept(fd, nullptr, nullptr);
    const std::string hello = std::string(wire::kMagic, wire::kMagicSize) + '\x01' + std::string(wire::kNonceSize, 'n');
    (void)!::write(peer, hello.data(), hello.size());
    std::string answer(wire::kClientHelloSize, '\0');
    size_t got = 0;
    while (got < answer.size()) {
      const ssize_t n = ::read(peer, answer.data() + got, answer.size() - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    const std::string accept = std::string(1, wire::kAccepted) + std::string(wire::kMacSize, '\0');
    (void)!::write(peer, accept.data(), accept.size());
    char drain;
    (void)!::read(peer, &drain, 1);  // until the client hangs up
    ::close(peer);
  });
  try {
    client(socket.port());
    ADD_FAILURE() << "a rank trusted an impostor store";
  } catch (const StoreAuthError& e) {
    EXPECT_NE(std::string(e.what()).find("could not prove"), std::string::npos) << e.what();
  }
  impostor.join();
}

// True when the server closed `fd` (EOF after the greeting) within `limit`.
bool closedByServer(int fd, std::chrono::milliseconds limit) {
  char buffer[256];
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n <= 0) return true;
  }
  return false;
}

TEST(DdpStore, GarbageAndSilentClientsAreDropped) {
  StoreServerOptions options;
  options.handshakeTimeout = std::chrono::milliseconds(300);
  Served s = serve(kToken, options);
  const int garbage = ddp::test::connectLoopback(static_cast<uint16_t>(s.port));
  const std::string junk(200, '\x7f');
  ASSERT_EQ(::write(garbage, junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  EXPECT_TRUE(closedByServer(garbage, std::chrono::seconds(5)));
  const int silent = ddp::test::connectLoopback(static_cast<uint16_t>(s.port));
  EXPECT_TRUE(closedByServer(silent, std::chrono::seconds(5)));
  ::close(garbage);
  ::close(silent);
  const auto stats = s.server->stats();
  EXPECT_EQ(stats.rejected, 1u);
  EXPECT_EQ(stats.timedOut, 1u);
  auto job = client(s.port);
  EXPECT_EQ(job->add("still", 1), 1);
}

TEST(DdpStore, AFloodOfConnectionsDoesNotLockTheJobOut) {
  rlimit limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  const rlim_t wanted = 2600;
  if (limit.rlim_cur < wanted && limit.rlim_max >= wanted) {
    limit.rlim_cur = wanted;
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &limit), 0);
  }
  ASSERT_GE(limit.rlim_cur, wanted) << "this test needs 2600 open files (ulimit -n)";
  Served s = serve();
  std::vector<int> flood;
  for (int i = 0; i < 1000; ++i) {
    const int fd = ddp::test::connectLoopback(static_cast<uint16_t>(s.port));
    ASSERT_GE(fd, 0) << "connection " << i;
    flood.push_back(fd);
  }
  auto job = client(s.port);
  job->set("k", bytes("v"));
  EXPECT_EQ(text(job->get("k")), "v");
  EXPECT_GE(s.server->stats().shed, 1000u - StoreServerOptions{}.maxUnauthenticated);
  for (const int fd : flood) ::close(fd);
}

TEST(DdpStore, ARequestAfterTheServerIsGoneFailsWithAClearError) {
  Served s = serve();
  auto store = client(s.port);
  store->set("k", bytes("v"));
  s.server.reset();
  try {
    store->get("k");
    FAIL() << "no error from a store whose server is gone";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("connection closed"), std::string::npos) << e.what();
  }
}

TEST(ShmSegment, ARankMapsOnlyAPrivateSegmentOfItsOwner) {
  // Another program's segment under a name the store gives: readable by others, so refused.
  const std::string name = "/ddp-store-test-" + newJobToken();
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fchmod(fd, 0644), 0);
  ASSERT_EQ(::ftruncate(fd, 1 << 20), 0);
  ::close(fd);
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->set("ddp/shm/name", bytes(name));
  ShmOptions options;
  options.rank = 1;
  options.worldSize = 2;
  options.timeout = std::chrono::seconds(2);
  try {
    makeShmCommunicator(store, options);
    ADD_FAILURE() << "mapped a segment that others can read";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("will not map"), std::string::npos) << e.what();
  }
  ::shm_unlink(name.c_str());
}

}  // namespace
}  // namespace ddp::comm
