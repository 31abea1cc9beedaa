#include "common/store_client.h"

#include <cerrno>
#include <cstring>
#include <thread>

#include <arpa/inet.h>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/store_wire.h"
#include "common/sha256.h"

namespace ddp::comm {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

// Reads exactly `size` bytes by `deadline`; false on EOF or error (errno kept), throws nothing.
enum class IoResult { kOk, kClosed, kTimeout };

IoResult readExactly(int fd, char* data, std::size_t size, Clock::time_point deadline) {
  std::size_t done = 0;
  while (done < size) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return IoResult::kTimeout;
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left, 1 << 30)));
    if (ready < 0 && errno != EINTR) return IoResult::kClosed;
    if (ready <= 0) continue;
    const ssize_t got = ::recv(fd, data + done, size - done, 0);
    if (got == 0) return IoResult::kClosed;
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return IoResult::kClosed;
    }
    done += static_cast<std::size_t>(got);
  }
  return IoResult::kOk;
}

bool writeAll(int fd, const std::string& data) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t sent = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<std::size_t>(sent);
  }
  return true;
}

// connect() that gives up at `deadline`: a blocking one waits out the kernel's SYN retries (about
// two minutes) where a host drops the packets. The socket stays blocking afterwards.
bool connectWithin(int fd, const sockaddr* address, socklen_t size, Clock::time_point deadline, std::string& error) {
  const int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  bool connected = ::connect(fd, address, size) == 0;
  if (!connected && errno != EINPROGRESS) {
    error = std::strerror(errno);
    return false;
  }
  while (!connected) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      error = "no answer to the connection";
      return false;
    }
    pollfd p{fd, POLLOUT, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left, 1 << 30)));
    if (ready < 0 && errno != EINTR) {
      error = std::strerror(errno);
      return false;
    }
    if (ready <= 0) continue;
    int status = 0;
    socklen_t length = sizeof(status);
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &status, &length) != 0 || status != 0) {
      error = std::strerror(status != 0 ? status : errno);
      return false;
    }
    connected = true;
  }
  ::fcntl(fd, F_SETFL, flags);
  return true;
}

// A connected socket, retrying refused connections (the server may not listen yet) until deadline.
int connectBy(const std::string& host, std::uint16_t port, Clock::time_point deadline, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  auto pause = std::chrono::milliseconds(10);
  while (true) {
    addrinfo* found = nullptr;
    const int status = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
    if (status != 0) {
      error = std::string("'") + host + "' does not resolve (" + ::gai_strerror(status) + ")";
    } else {
      for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (connectWithin(fd, a->ai_addr, a->ai_addrlen, deadline, error)) {
          ::freeaddrinfo(found);
          const int on = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
          return fd;
        }
        ::close(fd);
      }
      ::freeaddrinfo(found);
    }
    if (Clock::now() + pause >= deadline) return -1;
    std::this_thread::sleep_for(pause);  // a retry interval, not synchronisation
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
}

}  // namespace

StoreClient::StoreClient(StoreClientOptions options) : options_(std::move(options)) { connectAndAuthenticate(); }

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string StoreClient::localAddress() const {
  sockaddr_storage address{};
  socklen_t size = sizeof(address);
  if (fd_ < 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &size) != 0) return "";
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw = address.ss_family == AF_INET6
                        ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(&address)->sin6_addr)
                        : static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(&address)->sin_addr);
  return ::inet_ntop(address.ss_family, raw, text, sizeof(text)) ? text : "";
}

void StoreClient::connectAndAuthenticate() {
  const auto deadline = Clock::now() + options_.timeout;
  // A flood of unauthenticated connections can shed ours before we answer: try again.
  std::string error = "no answer";
  while (Clock::now() < deadline) {
    const int fd = connectBy(options_.host, options_.port, deadline, error);
    if (fd < 0) break;
    std::string hello(wire::kServerHelloSize, '\0');
    const IoResult got = readExactly(fd, hello.data(), hello.size(), deadline);
    if (got != IoResult::kOk) {
      ::close(fd);
      error = got == IoResult::kTimeout ? "no greeting" : "closed before its greeting";
      continue;
    }
    if (hello.compare(0, wire::kMagicSize, wire::kMagic) != 0) {
      ::close(fd);
      DDP_THROW(CommError, "the server at ", where(),
                " is not a ddp-launch store (is MASTER_PORT another program's, e.g. a PyTorch TCPStore?)");
    }
    const bool tokenRequired = hello[wire::kMagicSize] != 0;
    const std::string serverNonce = hello.substr(wire::kMagicSize + 1, wire::kNonceSize);
    if (!tokenRequired && !options_.token.empty()) {
      ::close(fd);
      DDP_THROW(StoreAuthError, "the store at ", where(),
                " asks for no token but ", options_.who, " has one: it is not this job's store, or ", options_.server,
                " was started without the job's token");
    }
    const std::string clientNonce = crypto::randomBytes(wire::kNonceSize);
    std::string mac(wire::kMacSize, '\0');
    if (!options_.token.empty()) {
      const auto digest = crypto::hmacSha256(options_.token, wire::macMessage("client", serverNonce, clientNonce));
      mac.assign(digest.begin(), digest.end());
    }
    if (!writeAll(fd, std::string(wire::kMagic, wire::kMagicSize) + clientNonce + mac)) {
      ::close(fd);
      error = std::strerror(errno);
      continue;
    }
    char verdict = 0;
    if (readExactly(fd, &verdict, 1, deadline) != IoResult::kOk) {
      ::close(fd);
      error = "closed during the handshake";
      continue;
    }
    if (verdict == wire::kRejected) {
      ::close(fd);
      DDP_THROW(StoreAuthError, "the store at ", where(), options_.token.empty() ? " needs the job's token and " + options_.who + " has none"
                                                                              : " rejected " + options_.who + "'s token");
    }
    std::string proof(wire::kMacSize, '\0');
    if (verdict != wire::kAccepted || readExactly(fd, proof.data(), proof.size(), deadline) != IoResult::kOk) {
      ::close(fd);
      error = "malformed handshake";
      continue;
    }
    if (!options_.token.empty()) {
      const auto expected = crypto::hmacSha256(options_.token, wire::macMessage("server", serverNonce, clientNonce));
      if (!crypto::equalConstantTime(proof, std::string(expected.begin(), expected.end()))) {
        ::close(fd);
        DDP_THROW(StoreAuthError, "the store at ", where(),
                  " could not prove it holds this job's token: it is not this job's store");
      }
    }
    fd_ = fd;
    return;
  }
  throw StoreUnreachableError(
      detail::concat("could not reach the store at ", where(), " within ", seconds(options_.timeout), " s (", error, ")"),
      error);
}

std::string StoreClient::request(const std::string& body, std::chrono::milliseconds wait, const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) DDP_THROW(CommError, "the store at ", where(), " is closed (an earlier request failed)");
  wire::Writer frame;
  frame.u32(static_cast<std::uint32_t>(body.size()));
  // A server that stops answering (rank 0 stopped, its host gone) is noticed a little after
  // the wait the server itself would have ended.
  const std::chrono::milliseconds limit = std::max(wait, options_.timeout) + std::chrono::seconds(5);
  const auto deadline = Clock::now() + limit;
  auto fail = [&](const std::string& why) {
    ::close(fd_);
    fd_ = -1;
    DDP_THROW(CommError, "store ", what, " at ", where(), " failed (", why, ")");
  };
  if (!writeAll(fd_, frame.raw() + body)) fail(std::strerror(errno));
  char header[4];
  IoResult got = readExactly(fd_, header, 4, deadline);
  if (got == IoResult::kTimeout) {
    ::close(fd_);
    fd_ = -1;
    DDP_THROW(TimeoutError, "store ", what, " at ", where(), ": no answer within ", seconds(limit), " s");
  }
  if (got == IoResult::kClosed) fail("connection closed: did " + options_.server + " stop?");
  const std::uint32_t length = wire::Reader(header, 4).u32();
  if (length == 0 || length > wire::kMaxFrame) fail("malformed reply");
  std::string reply(length, '\0');
  if (readExactly(fd_, reply.data(), length, deadline) != IoResult::kOk) fail("connection closed: did " + options_.server + " stop?");
  const auto status = static_cast<wire::Status>(reply[0]);
  if (status == wire::Status::kTimeout) {
    DDP_THROW(TimeoutError, "store ", what, " timed out after ", seconds(wait), " s");
  }
  if (status != wire::Status::kOk) fail("the server refused the request");
  return reply.substr(1);
}

namespace {

std::string keysField(wire::Writer& w, const std::vector<std::string>& keys) {
  w.u32(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  return "";
}

}  // namespace

void StoreClient::set(const std::string& key, const Bytes& value) {
  wire::Writer w;
  w.u8(static_cast<std::uint8_t>(wire::Op::kSet)).str(key).vec(value);
  request(w.raw(), options_.timeout, "set of '" + key + "'");
}

StoreClient::Bytes StoreClient::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  wire::Writer w;
  w.u8(static_cast<std::uint8_t>(wire::Op::kCompareSet)).str(key).vec(expected).vec(desired);
  const std::string body = request(w.raw(), options_.timeout, "compare_set of '" + key + "'");
  return wire::Reader(body.data(), body.size()).vec();
}

StoreClient::Bytes StoreClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  wire::Writer w;
  w.u8(static_cast<std::uint8_t>(wire::Op::kGet)).str(key).u64(static_cast<std::uint64_t>(timeout.count()));
  const std::string body = request(w.raw(), timeout, "get of '" + key + "'");
  return wire::Reader(body.data(), body.size()).vec();
}

std::int64_t StoreClient::add(const std::string& key, std::int64_t value) {
  wire::Writer w;
  w.u8(static_cast<std::uint8_t>(wire::Op::kAdd)).str(key).u64(static_cast<std::uint64_t>(value));
  const std::string body = request(w.raw(), options_.timeout, "add of '" + key + "'");
  return static_cast<std::int64_t>(wire::Reader(body.data(), body.size()).u64());
}

bool StoreClient::deleteKey(const std::string& key) {
  wire::Writer w;
  w.u8(static_cast<std::uint8_t>(wire::Op::kDelete)).str(key);
  return request(w.raw(), options_.timeout, "delete of '" + key + "'").at(0) != 0;
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  wire::Writer w;
  w.u8(static_cast<std::uint8_t>(wire::Op::kCheck));
  keysField(w, keys);
  return request(w.raw(), options_.timeout, "check").at(0) != 0;
}

std::int64_t StoreClient::numKeys() {
  wire::Writer w;
  w.u8(static_cast<std::uint8_t>(wire::Op::kNumKeys));
  const std::string body = request(w.raw(), options_.timeout, "num_keys");
  return static_cast<std::int64_t>(wire::Reader(body.data(), body.size()).u64());
}

void StoreClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  wire::Writer w;
  w.u8(static_cast<std::uint8_t>(wire::Op::kWait));
  keysField(w, keys);
  w.u64(static_cast<std::uint64_t>(timeout.count()));
  request(w.raw(), timeout, "wait for " + std::to_string(keys.size()) + " key(s)" +
                                (keys.empty() ? "" : " ('" + keys.front() + "'...)"));
}

void StoreClient::append(const std::string& key, const Bytes& value) {
  wire::Writer w;
  w.u8(static_cast<std::uint8_t>(wire::Op::kAppend)).str(key).vec(value);
  request(w.raw(), options_.timeout, "append to '" + key + "'");
}

std::vector<StoreClient::Bytes> StoreClient::multiGet(const std::vector<std::string>& keys,
                                                      std::chrono::milliseconds timeout) {
  wire::Writer w;
  w.u8(static_cast<std::uint8_t>(wire::Op::kMultiGet));
  keysField(w, keys);
  w.u64(static_cast<std::uint64_t>(timeout.count()));
  const std::string body = request(w.raw(), timeout, "multi_get");
  wire::Reader r(body.data(), body.size());
  std::vector<Bytes> values(r.u32());
  for (auto& v : values) v = r.vec();
  return values;
}

void StoreClient::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  DDP_ENFORCE_EQ(keys.size(), values.size());
  wire::Writer w;
  w.u8(static_cast<std::uint8_t>(wire::Op::kMultiSet)).u32(static_cast<std::uint32_t>(keys.size()));
  for (std::size_t i = 0; i < keys.size(); ++i) w.str(keys[i]).vec(values[i]);
  request(w.raw(), options_.timeout, "multi_set");
}

}  // namespace ddp::comm
