// Slurm's compressed tasks-per-node lists (SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE):
// "2(x3),1" is 2, 2, 2, 1, one entry per node. Shared by the worker and the launcher.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/error.h"

namespace ddp {

/// Expands `value` (the variable `name`); throws ConfigError naming it when it is malformed.
inline std::vector<int> expandTasksPerNode(const std::string& name, const std::string& value) {
  auto bad = [&] { DDP_THROW(ConfigError, "environment: ", name, "='", value, "' is not like 2(x3),1"); };
  auto number = [&](const std::string& text, long minimum) {
    if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos || text.size() > 7) bad();
    const long v = std::strtol(text.c_str(), nullptr, 10);
    if (v < minimum) bad();
    return static_cast<int>(v);
  };
  std::vector<int> out;
  std::size_t at = 0;
  while (at <= value.size()) {
    const std::size_t comma = std::min(value.find(',', at), value.size());
    const std::string item = value.substr(at, comma - at);
    const std::size_t paren = item.find("(x");
    const int tasks = number(item.substr(0, paren), 0);
    int repeat = 1;
    if (paren != std::string::npos) {
      if (item.back() != ')') bad();
      repeat = number(item.substr(paren + 2, item.size() - paren - 3), 1);
    }
    if (repeat > 1 << 20) bad();
    out.insert(out.end(), static_cast<std::size_t>(repeat), tasks);
    at = comma + 1;
  }
  return out;
}

}  // namespace ddp
