// Levenshtein distance, for "did you mean" suggestions (the worker's config keys, the launcher's flags).
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace ddp {

/// The single-character insertions, deletions and substitutions that turn `a` into `b`.
inline std::size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
    }
  }
  return row[b.size()];
}

}  // namespace ddp
