// Rank lists for error messages: consecutive ranks as ranges ("0, 2-9999"), so a timeout at a
// large world size stays one readable line, whatever the number of missing ranks.
#pragma once

#include <string>
#include <vector>

namespace ddp {

/// `ranks` (ascending) as "a, b-c, ..."; after `maxRanges` ranges, "... (N more ranks)".
inline std::string rankRanges(const std::vector<int>& ranks, std::size_t maxRanges = 20) {
  std::string out;
  std::size_t ranges = 0;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (ranges == maxRanges) {
      out += ", ... (" + std::to_string(ranks.size() - i) + " more ranks)";
      break;
    }
    out += (out.empty() ? "" : ", ") + std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    ++ranges;
    i = j + 1;
  }
  return out;
}

}  // namespace ddp
