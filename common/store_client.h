// A client of the job's store (common/store_server) without LibTorch: the launcher's rendezvous
// and heartbeats use it, and comm/ddp_store wraps it as a c10d::Store for the workers. It proves the
// job's token when it connects and checks the server's proof in turn, so it never talks to an
// impostor store either. One connection; requests are serialised.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"

namespace ddp::comm {

/// The store refused this client's token, or the server failed to prove it holds it.
class StoreAuthError : public CommError {
 public:
  using CommError::CommError;
};

/// No store answered at host:port within the timeout; reason() is the last cause (e.g. refused).
class StoreUnreachableError : public TimeoutError {
 public:
  StoreUnreachableError(const std::string& what, std::string reason)
      : TimeoutError(what), reason_(std::move(reason)) {}
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

struct StoreClientOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  std::string token;  // empty: no token (accepted only by a server that asks for none)
  /// Connection attempts (the server may not be up yet) and every request end within this.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  /// Who is asking, for messages: "rank 3", "the launcher".
  std::string who = "this rank";
  /// Who serves the store, for messages when it stops answering: "rank 0", "node 0's launcher".
  std::string server = "rank 0";
};

class StoreClient {
 public:
  using Bytes = std::vector<std::uint8_t>;

  /// Connects and authenticates; throws StoreAuthError (token), CommError (not our store) or
  /// StoreUnreachableError.
  explicit StoreClient(StoreClientOptions options);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  // A failed request (connection lost) throws CommError and closes the client; a wait that ends
  // without its keys throws TimeoutError and leaves it usable.
  void set(const std::string& key, const Bytes& value);
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired);
  Bytes get(const std::string& key, std::chrono::milliseconds timeout);
  std::int64_t add(const std::string& key, std::int64_t value);
  bool deleteKey(const std::string& key);
  bool check(const std::vector<std::string>& keys);
  std::int64_t numKeys();
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  void append(const std::string& key, const Bytes& value);
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values);

  const StoreClientOptions& options() const { return options_; }
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  void setTimeout(std::chrono::milliseconds timeout) { options_.timeout = timeout; }
  std::string where() const { return options_.host + ":" + std::to_string(options_.port); }
  /// This end's address of the connection ("10.0.0.2"): the address the server's host reaches us at.
  std::string localAddress() const;

 private:
  void connectAndAuthenticate();
  /// Sends one request and returns the reply's body after its status byte; throws TimeoutError
  /// when the server answers that the keys did not appear within `wait`.
  std::string request(const std::string& body, std::chrono::milliseconds wait, const std::string& what);

  StoreClientOptions options_;
  std::mutex mutex_;
  int fd_ = -1;
};

}  // namespace ddp::comm
