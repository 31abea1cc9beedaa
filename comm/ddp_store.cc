#include "comm/ddp_store.h"

#include "common/store_server.h"

namespace ddp::comm {

DdpStore::DdpStore(DdpStoreOptions options, std::shared_ptr<StoreServer> server)
    : c10d::Store(options.timeout),
      options_(std::move(options)),
      server_(std::move(server)),
      client_(std::make_unique<StoreClient>(options_)) {}

DdpStore::~DdpStore() = default;

// c10d::Store::setTimeout changes timeout_; every request takes the current one.
StoreClient& DdpStore::client() {
  client_->setTimeout(timeout_);
  return *client_;
}

void DdpStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  client().set(key, value);
}

std::vector<uint8_t> DdpStore::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                          const std::vector<uint8_t>& desired) {
  return client().compareSet(key, expected, desired);
}

std::vector<uint8_t> DdpStore::get(const std::string& key) {
  return client().get(key, timeout_);
}

int64_t DdpStore::add(const std::string& key, int64_t value) {
  return client().add(key, value);
}

bool DdpStore::deleteKey(const std::string& key) {
  return client().deleteKey(key);
}

bool DdpStore::check(const std::vector<std::string>& keys) {
  return client().check(keys);
}

int64_t DdpStore::getNumKeys() {
  return client().numKeys();
}

void DdpStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void DdpStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  client().wait(keys, timeout);
}

#if TORCH_VERSION_MAJOR >= 2
c10::intrusive_ptr<c10d::Store> DdpStore::clone() {
  DdpStoreOptions options = options_;
  options.timeout = timeout_;
  return c10::make_intrusive<DdpStore>(options, server_);
}

void DdpStore::append(const std::string& key, const std::vector<uint8_t>& value) {
  client().append(key, value);
}

std::vector<std::vector<uint8_t>> DdpStore::multiGet(const std::vector<std::string>& keys) {
  return client().multiGet(keys, timeout_);
}

void DdpStore::multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) {
  client().multiSet(keys, values);
}
#endif

}  // namespace ddp::comm
