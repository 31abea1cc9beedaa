// The worker's config keys: each dotted key bound to its WorkerConfig field, how YAML sets it and
// how it is written back (config.resolved.yaml, --config-keys). The one table of keys.
#pragma once

#include <yaml-cpp/yaml.h>

#include <functional>
#include <string>
#include <vector>

#include "worker/config/config.h"

namespace ddp::worker {

/// One accepted key: how to read it from YAML and write it back.
struct Field {
  std::string key;
  std::string type;  // for error messages
  std::function<void(const YAML::Node&)> set;
  std::function<YAML::Node()> get;
};

/// Every key, section by section (run, model, data, train, output, comm), bound to `c`'s fields.
std::vector<Field> fieldsOf(WorkerConfig& c);

}  // namespace ddp::worker
