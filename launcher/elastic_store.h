// An elastic job's state in its rendezvous store: the keys, the rounds, and why a round ends
// (launcher/elastic.h tells the protocol). Shared by the agent (launcher/elastic.cc) and its
// watchers (launcher/elastic_watch.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/store_client.h"

namespace ddp::launcher::elastic {

using Clock = std::chrono::steady_clock;
using Bytes = std::vector<std::uint8_t>;

Bytes bytes(const std::string& s);
std::string text(const Bytes& b);
std::chrono::milliseconds millis(double seconds);
double secondsSince(Clock::time_point t);
/// `s` as the shortest decimal that reads back ("1.5", "30").
std::string seconds(double s);

/// Node ids as the store keeps them: "0,2,3".
std::vector<int> parseIds(const std::string& list);
std::string joinIds(const std::vector<int>& ids);
bool contains(const std::vector<int>& ids, int id);

/// The store's keys of one elastic job.
struct Keys {
  std::string prefix;  // "elastic/<rdzv_id>/"
  std::string nodeIds() const { return prefix + "node_ids"; }
  std::string round() const { return prefix + "round"; }
  std::string final() const { return prefix + "final"; }
  std::string finished() const { return prefix + "finished"; }
  std::string node(int id) const { return prefix + "node/" + std::to_string(id); }
  std::string heartbeat(int id) const { return prefix + "heartbeat/" + std::to_string(id); }
  /// Why a node left (kDone when its workers finished); absent while it is in the job.
  std::string left(int id) const { return prefix + "left/" + std::to_string(id); }
  std::string inRound(std::int64_t round, const std::string& what) const {
    return prefix + "round_" + std::to_string(round) + "/" + what;
  }
};

/// A node's reason for leaving when its workers finished.
constexpr const char* kDone = "done";

/// One round as this launcher took part in it.
struct Round {
  std::int64_t number = 0;
  std::vector<int> nodes;  // node ids, ascending: node rank = index
  int index = 0;           // this node's rank in the round
};

/// Why a round ended, as endRound() wrote it.
struct EndReason {
  char kind = 'F';
  int failures = 0;
  std::string why;
};

EndReason parseEnd(const std::string& standing);

/// Sets why round `round` ends unless another node did first, and returns the reason that stands:
/// "<kind> <failures> <text>", kind F (a worker failed), L (a node left), J (nodes wait to join),
/// C (a worker's bad configuration). F and L count towards --max_restarts; <failures> is the count
/// with this round's end included, carried from round to round in the end reasons themselves (a
/// round opens only after the previous one's end is set), so no launcher's death can lose one.
std::string endRound(comm::StoreClient& store, const Keys& keys, std::int64_t round, char kind, const std::string& why);

}  // namespace ddp::launcher::elastic
