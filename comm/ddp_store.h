// The client of the job's store (comm/store_server): a c10d::Store, so Gloo, NCCL and our own
// code use it as they would a TCPStore. It proves the job's token when it connects and checks the
// server's proof in turn, so a rank never talks to an impostor store either.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/version.h>

#include "common/error.h"

namespace ddp::comm {

class StoreServer;

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

struct DdpStoreOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  std::string token;  // empty: no token (accepted only by a server that asks for none)
  /// Connection attempts (the server may not be up yet) and every request end within this.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

class DdpStore final : public c10d::Store {
 public:
  /// Connects and authenticates; throws StoreAuthError (token) or CommError/TimeoutError (reach).
  /// `server` (rank 0's) is kept alive as long as this store and its clones.
  explicit DdpStore(DdpStoreOptions options, std::shared_ptr<StoreServer> server = nullptr);
  ~DdpStore() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
#if TORCH_VERSION_MAJOR >= 2
  c10::intrusive_ptr<c10d::Store> clone() override;
  void append(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) override;
  bool hasExtendedApi() const override { return true; }
#endif

  std::string where() const { return options_.host + ":" + std::to_string(options_.port); }

 private:
  void connectAndAuthenticate();
  /// Sends one request and returns the reply's body after its status byte; throws TimeoutError
  /// when the server answers that the keys did not appear within `wait`.
  std::string request(const std::string& body, std::chrono::milliseconds wait, const std::string& what);

  DdpStoreOptions options_;
  std::shared_ptr<StoreServer> server_;
  std::mutex mutex_;
  int fd_ = -1;
};

}  // namespace ddp::comm
