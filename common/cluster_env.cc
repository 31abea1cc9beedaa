#include "common/cluster_env.h"

#include <cstddef>

#include "common/error.h"

namespace ddp {
namespace {

constexpr std::size_t kMaxHosts = 1 << 20;

struct Range {
  unsigned long low = 0;
  unsigned long high = 0;
  std::size_t width = 0;  // zero-padded width, that of the first number as written
};

[[noreturn]] void malformed(const std::string& name, const std::string& value, const std::string& why) {
  DDP_THROW(ConfigError, "environment: ", name, "='", value, "' is not a Slurm hostlist like node[01-04,07] (",
            why, ")");
}

unsigned long number(const std::string& name, const std::string& value, const std::string& digits) {
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) {
    malformed(name, value, "'" + digits + "' is not a number");
  }
  return std::stoul(digits);
}

// "01-03,7" -> {1..3 width 2}, {7..7 width 1}
std::vector<Range> parseRanges(const std::string& name, const std::string& value, const std::string& body) {
  std::vector<Range> ranges;
  std::size_t at = 0;
  while (at <= body.size()) {
    const std::size_t comma = std::min(body.find(',', at), body.size());
    const std::string item = body.substr(at, comma - at);
    const std::size_t dash = item.find('-');
    Range r;
    const std::string low = item.substr(0, dash);
    r.low = number(name, value, low);
    r.high = dash == std::string::npos ? r.low : number(name, value, item.substr(dash + 1));
    r.width = low.size();
    if (r.high < r.low) malformed(name, value, "range '" + item + "' runs backwards");
    ranges.push_back(r);
    at = comma + 1;
  }
  return ranges;
}

std::string padded(unsigned long n, std::size_t width) {
  std::string text = std::to_string(n);
  if (text.size() < width) text.insert(0, width - text.size(), '0');
  return text;
}

// One comma-separated item, e.g. "b[1-2]-x[3-4]": the product of its bracket groups, in order.
void expandItem(const std::string& name, const std::string& value, const std::string& item,
                std::vector<std::string>& out, bool firstOnly) {
  std::vector<std::string> partial{""};
  std::size_t at = 0;
  while (at < item.size()) {
    const std::size_t open = item.find('[', at);
    const std::string text = item.substr(at, open == std::string::npos ? std::string::npos : open - at);
    if (text.find(']') != std::string::npos) malformed(name, value, "']' without '['");
    for (std::string& p : partial) p += text;
    if (open == std::string::npos) break;
    const std::size_t close = item.find(']', open);
    if (close == std::string::npos) malformed(name, value, "'[' without ']'");
    const std::vector<Range> ranges = parseRanges(name, value, item.substr(open + 1, close - open - 1));
    std::vector<std::string> next;
    // Slurm's order: the first bracket group varies slowest.
    for (const std::string& p : partial) {
      for (const Range& r : ranges) {
        for (unsigned long n = r.low; n <= r.high; ++n) {
          if (next.size() >= kMaxHosts) malformed(name, value, "more than a million hosts");
          next.push_back(p + padded(n, r.width));
          if (firstOnly) break;
        }
        if (firstOnly) break;
      }
    }
    partial.swap(next);
    at = close + 1;
  }
  for (std::string& p : partial) {
    if (p.empty()) malformed(name, value, "empty host name");
    out.push_back(std::move(p));
  }
}

std::vector<std::string> expand(const std::string& name, const std::string& value, bool firstOnly) {
  if (value.empty()) malformed(name, value, "empty");
  std::vector<std::string> hosts;
  std::size_t at = 0;
  int depth = 0;
  std::size_t start = 0;
  for (; at <= value.size(); ++at) {
    const char c = at < value.size() ? value[at] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1) malformed(name, value, "unbalanced brackets");
    if (c == ',' && depth == 0) {
      expandItem(name, value, value.substr(start, at - start), hosts, firstOnly);
      if (firstOnly) return hosts;
      if (hosts.size() > kMaxHosts) malformed(name, value, "more than a million hosts");
      start = at + 1;
    }
  }
  if (depth != 0) malformed(name, value, "unbalanced brackets");
  return hosts;
}

}  // namespace

std::vector<std::string> expandHostlist(const std::string& name, const std::string& value) {
  return expand(name, value, false);
}

std::string firstHost(const std::string& name, const std::string& value) {
  return expand(name, value, true).front();
}

int clusterJobPort(unsigned long long jobId, unsigned long long stepId) {
  return 20000 + static_cast<int>((jobId % 10000 + 1009 * (stepId % 10000)) % 10000);
}

bool slurmSpecialStep(const std::string& stepId) {
  if (stepId == "batch" || stepId == "extern" || stepId == "interactive") return true;
  if (stepId.empty() || stepId.size() > 10 || stepId.find_first_not_of("0123456789") != std::string::npos) return false;
  return std::stoull(stepId) >= 4294967290ULL;
}

bool inSrunStep(const std::string& stepId, const std::string& stepTasksPerNode) {
  return (!stepTasksPerNode.empty() || !stepId.empty()) && !slurmSpecialStep(stepId);
}

unsigned long long slurmStepNumber(const std::string& stepId) {
  if (stepId.empty() || stepId.size() > 10 || stepId.find_first_not_of("0123456789") != std::string::npos) return 0;
  return slurmSpecialStep(stepId) ? 0 : std::stoull(stepId);
}

}  // namespace ddp
