#include "libddp/data/host_copy.h"

#include <c10/util/Exception.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>

#include "common/error.h"
#include "libddp/data/shared_tensors.h"
#include "libddp/internal.h"

namespace ddp {
namespace data {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::vector<uint8_t> bytesOf(const std::string& s) { return {s.begin(), s.end()}; }

nlohmann::json handleToJson(const SharedTensorsHandle& h) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& t : h.tensors) tensors.push_back({{"dtype", t.dtype}, {"shape", t.shape}, {"offset", t.offset}});
  return {{"pid", h.pid}, {"fd", h.fd}, {"bytes", h.bytes}, {"nonce", h.nonce}, {"tensors", tensors}};
}

SharedTensorsHandle handleFromJson(const nlohmann::json& j) {
  SharedTensorsHandle h;
  h.pid = j.at("pid").get<int64_t>();
  h.fd = j.at("fd").get<int>();
  h.bytes = j.at("bytes").get<uint64_t>();
  h.nonce = j.at("nonce").get<std::string>();
  for (const auto& t : j.at("tensors")) {
    h.tensors.push_back({t.at("dtype").get<int>(), t.at("shape").get<std::vector<int64_t>>(),
                         t.at("offset").get<uint64_t>()});
  }
  return h;
}

// The loading rank's failure, thrown again by the others with its class (so its exit code).
[[noreturn]] void rethrow(const nlohmann::json& j) {
  const std::string kind = j.value("kind", "");
  const std::string what = j.value("message", "the rank loading the data failed");
  if (kind == "config") throw ConfigError(what);
  if (kind == "data") throw DataError(what);
  throw Error(what);
}

}  // namespace

std::string hostIdentity() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return std::string(host) + "/" + boot;
}

HostCopy loadOncePerHost(c10d::Store& store, std::chrono::milliseconds timeout, int ranksOnHost,
                         const std::function<HostData()>& load, const std::string& name) {
  const std::string key = name + "/" + hostIdentity();
  const int64_t others = std::max(0, ranksOnHost - 1);
  // The last of the other ranks to have the copy (or the error) says so for all.
  const auto signalHave = [&] {
    if (store.add(key + "/have", 1) == others) store.set(key + "/all", bytesOf("1"));
  };
  const auto waitForOthers = [&](std::chrono::milliseconds limit) {
    if (others > 0) store.wait({key + "/all"}, limit);
  };
  HostCopy result;
  if (store.add(key + "/ranks", 1) == 1) {
    // This rank loads for the host; whatever happens, the others hear of it.
    nlohmann::json message;
    try {
      HostData loaded = load();
      auto shared = SharedTensors::create(loaded.tensors);
      message = {{"meta", loaded.meta}, {"handle", handleToJson(shared.handle())}};
      result = {shared.tensors(), loaded.meta, HostCopyOrigin::kSharedByThisRank};  // the loaded tensors go; the copy stays
      spdlog::info("{}: loaded once for this host into shared memory ({:.1f} MiB); the other ranks here map it", name,
                   static_cast<double>(shared.handle().bytes) / kMiB);
    } catch (const std::exception& e) {
      const auto* config = dynamic_cast<const ConfigError*>(&e);
      const auto* dataError = dynamic_cast<const DataError*>(&e);
      // LibTorch's errors carry a C++ backtrace in what(): the other ranks get the message only.
      const auto* torchError = dynamic_cast<const c10::Error*>(&e);
      std::string what = torchError ? torchError->what_without_backtrace() : e.what();
      if (torchError) what = what.substr(0, what.find('\n'));
      message = {{"kind", config ? "config" : dataError ? "data" : "other"}, {"message", what}};
      store.set(key + "/copy", bytesOf(message.dump()));
      try {
        waitForOthers(std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(30)));
      } catch (const std::exception&) {
        // A rank that never came cannot be helped; this rank's own error is what matters.
      }
      throw;
    }
    store.set(key + "/copy", bytesOf(message.dump()));
    waitForOthers(timeout);
  } else {
    store.wait({key + "/copy"}, timeout);
    const std::vector<uint8_t> raw = store.get(key + "/copy");
    const nlohmann::json message = nlohmann::json::parse(raw.begin(), raw.end());
    if (!message.contains("handle")) {
      signalHave();
      rethrow(message);
    }
    try {
      auto shared = SharedTensors::attach(handleFromJson(message.at("handle")));
      signalHave();
      result = {shared.tensors(), message.at("meta").get<std::string>(), HostCopyOrigin::kMappedFromHostCopy};
    } catch (const DataError& e) {
      signalHave();
      spdlog::warn("{}; loading the {} in this process instead (one more copy in memory)", e.what(), name);
      HostData own = load();
      result = {std::move(own.tensors), std::move(own.meta), HostCopyOrigin::kLoadedAfterMapFailed};
    }
  }
  return result;
}

}  // namespace data

HostCopy loadOncePerHost(const GroupStart& start, const std::function<HostData()>& load, const std::string& name) {
  const GroupStart::Impl& impl = start.impl();
  if (!impl.store || start.localSize() <= 1) {
    HostData own = load();
    return {std::move(own.tensors), std::move(own.meta), HostCopyOrigin::kLoaded};
  }
  return data::loadOncePerHost(*impl.store, start.timeout(), start.localSize(), load, name);
}

}  // namespace ddp
