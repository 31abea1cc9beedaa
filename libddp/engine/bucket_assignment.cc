#include "libddp/engine/bucket_assignment.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace ddp::engine {

std::vector<std::vector<size_t>> assignBuckets(const std::vector<at::Tensor>& params,
                                               size_t firstCapBytes, size_t capBytes) {
  struct Open {
    std::vector<size_t> indices;
    size_t bytes = 0;
    bool first = true;  // still filling this group's first bucket
  };
  using Key = std::tuple<int, int, int>;  // dtype, device type, device index
  std::map<Key, Open> open;
  std::vector<std::vector<size_t>> buckets;
  for (size_t n = params.size(); n-- > 0;) {
    const at::Tensor& p = params[n];
    const Key key{static_cast<int>(p.scalar_type()), static_cast<int>(p.device().type()),
                  p.device().index()};
    Open& bucket = open[key];
    bucket.indices.push_back(n);
    bucket.bytes += static_cast<size_t>(p.numel()) * p.element_size();
    if (bucket.bytes >= (bucket.first ? firstCapBytes : capBytes)) {
      buckets.push_back(std::move(bucket.indices));
      bucket.indices.clear();
      bucket.bytes = 0;
      bucket.first = false;
    }
  }
  // Partly filled buckets last, in the order their groups first appeared.
  std::vector<std::pair<size_t, std::vector<size_t>>> rest;
  for (auto& [key, bucket] : open) {
    if (!bucket.indices.empty()) rest.emplace_back(bucket.indices.front(), std::move(bucket.indices));
  }
  std::sort(rest.begin(), rest.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (auto& [first, indices] : rest) buckets.push_back(std::move(indices));
  return buckets;
}

}  // namespace ddp::engine
