#include "launcher/elastic_store.h"

#include <algorithm>
#include <sstream>

namespace ddp::launcher::elastic {

Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string text(const Bytes& b) { return std::string(b.begin(), b.end()); }
std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0));
}
double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
std::string seconds(double s) {
  std::ostringstream out;
  out << s;
  return out.str();
}

std::vector<int> parseIds(const std::string& list) {
  std::vector<int> ids;
  std::istringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) ids.push_back(std::stoi(item));
  }
  return ids;
}

std::string joinIds(const std::vector<int>& ids) {
  std::string out;
  for (int id : ids) out += (out.empty() ? "" : ",") + std::to_string(id);
  return out;
}

bool contains(const std::vector<int>& ids, int id) { return std::find(ids.begin(), ids.end(), id) != ids.end(); }

EndReason parseEnd(const std::string& standing) {
  EndReason end;
  std::istringstream in(standing);
  in >> end.kind >> end.failures;
  std::getline(in >> std::ws, end.why);
  return end;
}

std::string endRound(comm::StoreClient& store, const Keys& keys, std::int64_t round, char kind, const std::string& why) {
  const bool counts = kind == 'F' || kind == 'L';
  std::int64_t failures = 0;
  if (round > 0 && store.check({keys.inRound(round - 1, "end")})) {
    failures = parseEnd(text(store.get(keys.inRound(round - 1, "end"), store.timeout()))).failures;
  }
  if (counts) ++failures;
  const std::string mine = std::string(1, kind) + " " + std::to_string(failures) + " " + why;
  return text(store.compareSet(keys.inRound(round, "end"), {}, bytes(mine)));
}

}  // namespace ddp::launcher::elastic
