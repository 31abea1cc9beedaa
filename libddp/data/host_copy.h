// ddp::loadOncePerHost over a store (the public function hands it the rendezvous store).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <string>

#include "ddp/data.h"

namespace ddp::data {

/// loadOncePerHost() among the `ranksOnHost` ranks of this host that meet at `store`. The loading
/// rank returns only once the other ranks have the copy (or its error): were it to fail right after,
/// the store it may host must not vanish before they read the key.
HostCopy loadOncePerHost(c10d::Store& store, std::chrono::milliseconds timeout, int ranksOnHost,
                         const std::function<HostData()>& load, const std::string& name = "data");

/// hostname + "/" + boot id: one name per running machine (boot id tells apart containers or
/// hosts that share a hostname).
std::string hostIdentity();

}  // namespace ddp::data
