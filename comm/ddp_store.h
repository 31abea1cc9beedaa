// The client of the job's store (common/store_server) as a c10d::Store, so Gloo, NCCL and our own
// code use it as they would a TCPStore: common/store_client (which authenticates both ways) behind
// c10d's interface.
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
#include "common/store_client.h"

namespace ddp::comm {

class StoreServer;

/// How a rank reaches the job's store (common/store_client's options).
using DdpStoreOptions = StoreClientOptions;

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

  std::string where() const { return client_->where(); }

 private:
  StoreClient& client();

  DdpStoreOptions options_;
  std::shared_ptr<StoreServer> server_;
  std::unique_ptr<StoreClient> client_;
};

}  // namespace ddp::comm
