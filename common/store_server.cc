#include "common/store_server.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/store_wire.h"
#include "common/error.h"
#include "common/sha256.h"

namespace ddp::comm {
namespace {

using Clock = std::chrono::steady_clock;
using Value = std::vector<std::uint8_t>;

struct Connection {
  int fd = -1;
  bool authenticated = false;
  bool closeAfterFlush = false;
  Clock::time_point handshakeDeadline;
  std::string serverNonce;
  std::string in;
  std::string out;
  bool blocked = false;  // waiting for keys: no further request is read until it is answered
};

// A GET, WAIT or MULTI_GET waiting for keys that do not exist yet.
struct Waiter {
  std::uint64_t connection;
  wire::Op op;
  std::vector<std::string> keys;
  Clock::time_point deadline;
};

// What one request did: malformed (the connection closes), or served, changing the data (waiters
// may wake) or not.
enum class Served { kMalformed, kUnchanged, kChanged };

// More keys than this in one request is a malformed frame, not a plan.
constexpr std::uint32_t kMaxKeysPerRequest = 1u << 20;

std::string reply(wire::Status status, const std::string& body = "") {
  wire::Writer w;
  w.u32(static_cast<std::uint32_t>(1 + body.size())).u8(static_cast<std::uint8_t>(status));
  return w.raw() + body;
}

std::string valueField(const Value& v) { return wire::Writer().vec(v).raw(); }

std::string i64Field(std::int64_t v) { return wire::Writer().u64(static_cast<std::uint64_t>(v)).raw(); }

}  // namespace

struct StoreServer::Impl {
  StoreServerOptions options;
  int listenFd;
  int wakeRead = -1;
  int wakeWrite = -1;
  std::thread thread;
  mutable std::mutex statsMutex;
  StoreServerStats stats;

  std::map<std::uint64_t, Connection> connections;  // by id, in accept order
  std::uint64_t nextId = 1;
  std::list<Waiter> waiters;
  std::unordered_map<std::string, Value> data;

  Impl(int fd, StoreServerOptions opts) : options(std::move(opts)), listenFd(fd) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      ::close(listenFd);
      DDP_THROW(CommError, "store: pipe2 failed (", std::strerror(errno), ")");
    }
    wakeRead = fds[0];
    wakeWrite = fds[1];
    ::fcntl(listenFd, F_SETFL, ::fcntl(listenFd, F_GETFL) | O_NONBLOCK);
    thread = std::thread([this] { run(); });
  }

  ~Impl() {
    const char stop = 1;
    (void)!::write(wakeWrite, &stop, 1);
    thread.join();
    for (auto& [id, c] : connections) ::close(c.fd);
    ::close(listenFd);
    ::close(wakeRead);
    ::close(wakeWrite);
  }

  void count(std::uint64_t StoreServerStats::*field) {
    std::lock_guard<std::mutex> lock(statsMutex);
    ++(stats.*field);
  }

  void close(std::uint64_t id) {
    auto it = connections.find(id);
    if (it == connections.end()) return;
    ::close(it->second.fd);
    connections.erase(it);
    waiters.remove_if([id](const Waiter& w) { return w.connection == id; });
  }

  void accept(Clock::time_point now) {
    while (true) {
      const int fd = ::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR) continue;
        if ((errno == EMFILE || errno == ENFILE) && shedOldestUnauthenticated()) continue;
        return;  // EAGAIN, or out of descriptors with nothing to shed: the backlog waits
      }
      const int on = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
      Connection c;
      c.fd = fd;
      c.handshakeDeadline = now + options.handshakeTimeout;
      c.serverNonce = crypto::randomBytes(wire::kNonceSize);
      c.out = std::string(wire::kMagic, wire::kMagicSize) + static_cast<char>(options.token.empty() ? 0 : 1) +
              c.serverNonce;
      connections.emplace(nextId++, std::move(c));
      std::size_t pending = 0;
      for (const auto& [id, conn] : connections) pending += conn.authenticated ? 0 : 1;
      if (pending > options.maxUnauthenticated) shedOldestUnauthenticated();
    }
  }

  bool shedOldestUnauthenticated() {
    for (auto& [id, c] : connections) {
      if (!c.authenticated) {
        close(id);
        count(&StoreServerStats::shed);
        return true;
      }
    }
    return false;
  }

  // Returns false when the connection must close.
  bool handshake(Connection& c) {
    if (c.in.size() < wire::kClientHelloSize) return true;
    if (c.in.compare(0, wire::kMagicSize, wire::kMagic) != 0) {
      count(&StoreServerStats::rejected);
      return false;
    }
    const std::string clientNonce = c.in.substr(wire::kMagicSize, wire::kNonceSize);
    const std::string mac = c.in.substr(wire::kMagicSize + wire::kNonceSize, wire::kMacSize);
    c.in.erase(0, wire::kClientHelloSize);
    if (!options.token.empty()) {
      const auto expected = crypto::hmacSha256(options.token, wire::macMessage("client", c.serverNonce, clientNonce));
      if (!crypto::equalConstantTime(mac, std::string(expected.begin(), expected.end()))) {
        count(&StoreServerStats::rejected);
        c.out += wire::kRejected;
        c.closeAfterFlush = true;
        c.in.clear();
        return true;
      }
    }
    std::string proof(wire::kMacSize, '\0');
    if (!options.token.empty()) {
      const auto mine = crypto::hmacSha256(options.token, wire::macMessage("server", c.serverNonce, clientNonce));
      proof.assign(mine.begin(), mine.end());
    }
    c.out += wire::kAccepted + proof;
    c.authenticated = true;
    count(&StoreServerStats::admitted);
    return true;
  }

  bool allPresent(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [this](const std::string& k) { return data.count(k) != 0; });
  }

  std::string answerWaiter(const Waiter& w) const {
    if (w.op == wire::Op::kWait) return reply(wire::Status::kOk);
    if (w.op == wire::Op::kGet) return reply(wire::Status::kOk, valueField(data.at(w.keys[0])));
    wire::Writer values;
    values.u32(static_cast<std::uint32_t>(w.keys.size()));
    for (const auto& k : w.keys) values.vec(data.at(k));
    return reply(wire::Status::kOk, values.raw());
  }

  void wakeWaiters() {
    for (auto it = waiters.begin(); it != waiters.end();) {
      if (allPresent(it->keys)) {
        auto c = connections.find(it->connection);
        if (c != connections.end()) {
          c->second.out += answerWaiter(*it);
          c->second.blocked = false;
        }
        it = waiters.erase(it);
      } else {
        ++it;
      }
    }
  }

  // One request; false when it is malformed (the connection closes).
  bool serve(std::uint64_t id, Connection& c, const std::string& body, Clock::time_point now) {
    try {
      wire::Reader r(body.data(), body.size());
      const auto op = static_cast<wire::Op>(r.u8());
      const Served served = dispatch(op, r, id, c, now);
      if (served == Served::kMalformed || !r.done()) return false;  // trailing bytes are malformed too
      if (served == Served::kChanged) wakeWaiters();
      return true;
    } catch (const std::exception&) {  // short frame, a counter that is not a number
      return false;
    }
  }

  Served dispatch(wire::Op op, wire::Reader& r, std::uint64_t id, Connection& c, Clock::time_point now) {
    switch (op) {
      case wire::Op::kSet: return serveSet(r, c);
      case wire::Op::kGet:
      case wire::Op::kWait:
      case wire::Op::kMultiGet: return serveGet(op, r, id, c, now);
      case wire::Op::kAdd: return serveAdd(r, c);
      case wire::Op::kCheck: return serveCheck(r, c);
      case wire::Op::kDelete: return serveDelete(r, c);
      case wire::Op::kNumKeys:
        c.out += reply(wire::Status::kOk, i64Field(static_cast<std::int64_t>(data.size())));
        return Served::kUnchanged;
      case wire::Op::kCompareSet: return serveCompareSet(r, c);
      case wire::Op::kAppend: return serveAppend(r, c);
      case wire::Op::kMultiSet: return serveMultiSet(r, c);
      default: return Served::kMalformed;
    }
  }

  Served serveSet(wire::Reader& r, Connection& c) {
    std::string key = r.str();
    data[key] = r.vec();
    c.out += reply(wire::Status::kOk);
    return Served::kChanged;
  }

  // GET, WAIT and MULTI_GET answer now when every key exists, else block the connection until
  // they do or the request's timeout passes.
  Served serveGet(wire::Op op, wire::Reader& r, std::uint64_t id, Connection& c, Clock::time_point now) {
    Waiter w{id, op, {}, now};
    const std::uint32_t n = op == wire::Op::kGet ? 1 : r.u32();
    if (n > kMaxKeysPerRequest) return Served::kMalformed;
    for (std::uint32_t i = 0; i < n; ++i) w.keys.push_back(r.str());
    w.deadline = now + std::chrono::milliseconds(r.u64());
    if (allPresent(w.keys)) {
      c.out += answerWaiter(w);
    } else {
      c.blocked = true;
      waiters.push_back(std::move(w));
    }
    return Served::kUnchanged;
  }

  Served serveAdd(wire::Reader& r, Connection& c) {
    const std::string key = r.str();
    const auto delta = static_cast<std::int64_t>(r.u64());
    std::int64_t value = delta;
    if (auto it = data.find(key); it != data.end()) {
      value += std::stoll(std::string(it->second.begin(), it->second.end()));
    }
    const std::string text = std::to_string(value);
    data[key] = Value(text.begin(), text.end());
    c.out += reply(wire::Status::kOk, i64Field(value));
    return Served::kChanged;
  }

  Served serveCheck(wire::Reader& r, Connection& c) {
    const std::uint32_t n = r.u32();
    if (n > kMaxKeysPerRequest) return Served::kMalformed;
    std::vector<std::string> keys;
    for (std::uint32_t i = 0; i < n; ++i) keys.push_back(r.str());
    c.out += reply(wire::Status::kOk, std::string(1, allPresent(keys) ? 1 : 0));
    return Served::kUnchanged;
  }

  Served serveDelete(wire::Reader& r, Connection& c) {
    const bool erased = data.erase(r.str()) != 0;
    c.out += reply(wire::Status::kOk, std::string(1, erased ? 1 : 0));
    return Served::kUnchanged;
  }

  // c10d's semantics: a missing key with an empty expected value is set; the reply is the value
  // now stored (or the expected one, for a missing key that was not set).
  Served serveCompareSet(wire::Reader& r, Connection& c) {
    const std::string key = r.str();
    const Value expected = r.vec();
    Value desired = r.vec();
    auto it = data.find(key);
    if (it == data.end()) {
      if (expected.empty()) {
        data[key] = desired;
        c.out += reply(wire::Status::kOk, valueField(desired));
        return Served::kChanged;
      }
      c.out += reply(wire::Status::kOk, valueField(expected));
      return Served::kUnchanged;
    }
    if (it->second == expected) {
      it->second = std::move(desired);
      c.out += reply(wire::Status::kOk, valueField(it->second));
      return Served::kChanged;
    }
    c.out += reply(wire::Status::kOk, valueField(it->second));
    return Served::kUnchanged;
  }

  Served serveAppend(wire::Reader& r, Connection& c) {
    const std::string key = r.str();
    const Value more = r.vec();
    Value& v = data[key];
    v.insert(v.end(), more.begin(), more.end());
    c.out += reply(wire::Status::kOk);
    return Served::kChanged;
  }

  Served serveMultiSet(wire::Reader& r, Connection& c) {
    const std::uint32_t n = r.u32();
    if (n > kMaxKeysPerRequest) return Served::kMalformed;
    for (std::uint32_t i = 0; i < n; ++i) {
      std::string key = r.str();
      data[key] = r.vec();
    }
    c.out += reply(wire::Status::kOk);
    return Served::kChanged;
  }

  // Reads what arrived; false when the connection is done (closed by the peer, or misbehaving).
  bool readFrom(std::uint64_t id, Connection& c, Clock::time_point now) {
    char buffer[65536];
    while (true) {
      const ssize_t got = ::recv(c.fd, buffer, sizeof(buffer), 0);
      if (got == 0) return false;
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return false;
      }
      if (c.closeAfterFlush) continue;  // a rejected client: ignore what it still sends
      c.in.append(buffer, static_cast<std::size_t>(got));
      if (!c.authenticated && c.in.size() > wire::kClientHelloSize) break;
      if (c.in.size() > wire::kMaxFrame + 4) break;
    }
    if (!c.authenticated) {
      if (!handshake(c)) return false;
      if (!c.authenticated) return true;
    }
    while (!c.blocked && c.in.size() >= 4) {
      wire::Reader header(c.in.data(), 4);
      const std::uint32_t length = header.u32();
      if (length > wire::kMaxFrame || length == 0) {
        count(&StoreServerStats::badRequests);
        return false;
      }
      if (c.in.size() < 4 + length) break;
      const std::string body = c.in.substr(4, length);
      c.in.erase(0, 4 + length);
      if (!serve(id, c, body, now)) {
        count(&StoreServerStats::badRequests);
        return false;
      }
    }
    return true;
  }

  // Writes what is queued; false on a dead peer, or a rejected client once told.
  bool flush(Connection& c) {
    while (!c.out.empty()) {
      const ssize_t sent = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (sent < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        return false;
      }
      c.out.erase(0, static_cast<std::size_t>(sent));
    }
    return !c.closeAfterFlush;
  }

  void expire(Clock::time_point now) {
    for (auto it = waiters.begin(); it != waiters.end();) {
      if (it->deadline <= now) {
        auto c = connections.find(it->connection);
        if (c != connections.end()) {
          c->second.out += reply(wire::Status::kTimeout);
          c->second.blocked = false;
        }
        it = waiters.erase(it);
      } else {
        ++it;
      }
    }
    std::vector<std::uint64_t> late;
    for (const auto& [id, c] : connections) {
      if (!c.authenticated && c.handshakeDeadline <= now) late.push_back(id);
    }
    for (const auto id : late) {
      // Counted before the close: a client that sees its connection end finds it in stats().
      count(&StoreServerStats::timedOut);
      close(id);
    }
  }

  void run() {
    std::vector<pollfd> fds;
    std::vector<std::uint64_t> ids;
    while (true) {
      auto now = Clock::now();
      expire(now);
      // Flush replies produced by expiry or by waking waiters, and requests unblocked by them.
      std::vector<std::uint64_t> dead;
      for (auto& [id, c] : connections) {
        if (!c.blocked && !c.in.empty() && c.authenticated && !readFrom(id, c, now)) dead.push_back(id);
        else if (!flush(c)) dead.push_back(id);
      }
      for (const auto id : dead) close(id);

      Clock::time_point next = now + std::chrono::seconds(1);
      for (const auto& w : waiters) next = std::min(next, w.deadline);
      for (const auto& [id, c] : connections) {
        if (!c.authenticated) next = std::min(next, c.handshakeDeadline);
      }
      fds.clear();
      ids.clear();
      fds.push_back({wakeRead, POLLIN, 0});
      fds.push_back({listenFd, POLLIN, 0});
      for (const auto& [id, c] : connections) {
        short events = c.blocked ? 0 : POLLIN;
        if (!c.out.empty()) events |= POLLOUT;
        fds.push_back({c.fd, events, 0});
        ids.push_back(id);
      }
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
      const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(std::max<std::int64_t>(wait, 0) + 1));
      if (ready < 0 && errno != EINTR) return;
      if (fds[0].revents != 0) return;  // stop
      now = Clock::now();
      if (fds[1].revents & POLLIN) accept(now);
      for (std::size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        const std::uint64_t id = ids[i - 2];
        auto it = connections.find(id);
        if (it == connections.end()) continue;  // shed while accepting
        Connection& c = it->second;
        bool alive = true;
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) alive = readFrom(id, c, now);
        if (alive) alive = flush(c);
        if (!alive) close(id);
      }
    }
  }
};

StoreServer::StoreServer(int listenFd, StoreServerOptions options)
    : impl_(std::make_unique<Impl>(listenFd, std::move(options))) {}

StoreServer::~StoreServer() = default;

StoreServerStats StoreServer::stats() const {
  std::lock_guard<std::mutex> lock(impl_->statsMutex);
  return impl_->stats;
}

}  // namespace ddp::comm
