#include "launcher/hang_report.h"

#include <algorithm>
#include <csignal>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/no_follow.h"

namespace ddp::launcher {
namespace {

constexpr int kWorldGroup = 0;
constexpr size_t kMaxStacks = 4;
constexpr size_t kLoggedFrames = 24;
// A collective counts as stalled this long past its group's timeout: by then the rank's own timeout
// (and the census of who is missing, up to 2 x 3 s) would have ended it.
constexpr int64_t kStallGraceMs = 15000;

std::string seconds(int64_t ns) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", static_cast<double>(ns) / 1e9);
  return text;
}

bool pointToPoint(const flight::Record& r) { return r.op == "send" || r.op == "recv"; }

// "all_reduce #57 (DDP gradients) of 1024 float"
std::string describe(const flight::Record& r) {
  std::string out = r.op + " #" + std::to_string(r.seq);
  if (!r.label.empty()) out += " (" + r.label + ")";
  if (r.numel >= 0) out += " of " + std::to_string(r.numel) + (r.dtype.empty() ? "" : " " + r.dtype);
  if (r.peer >= 0) out += (r.op == "broadcast" ? " from root " : " with rank ") + std::to_string(r.peer);
  return out;
}

std::string rankList(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  return out;
}

// The world group's records of one rank by sequence number.
std::map<uint64_t, const flight::Record*> worldRecords(const RankRing& rank) {
  std::map<uint64_t, const flight::Record*> out;
  for (const flight::Record& r : rank.ring.records) {
    if (r.group == kWorldGroup) out[r.seq] = &r;
  }
  return out;
}

uint64_t lastFinished(const std::map<uint64_t, const flight::Record*>& records) {
  uint64_t last = 0;
  for (const auto& [seq, r] : records) {
    if (r->state == flight::State::kDone) last = seq;
  }
  return last;
}

std::string stateOf(const RankRing& rank) {
  if (rank.exited) return rank.exit.empty() ? "exited" : rank.exit;
  return rank.stopped ? "stopped (state T)" : "running";
}

// Splits eu-stack's or gdb's output into threads of function names.
std::vector<ThreadStack> parseStack(const std::string& text, bool gdb) {
  std::vector<ThreadStack> threads;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!gdb && line.rfind("TID ", 0) == 0) {
      threads.push_back(ThreadStack{std::atoi(line.c_str() + 4), {}});
      continue;
    }
    if (gdb && line.rfind("Thread ", 0) == 0) {
      // "Thread 1 (Thread 0x7f.. (LWP 1234) "name"):"
      const size_t lwp = line.find("LWP ");
      threads.push_back(ThreadStack{lwp == std::string::npos ? 0 : std::atoi(line.c_str() + lwp + 4), {}});
      continue;
    }
    if (line.empty() || line[0] != '#') continue;
    if (threads.empty()) threads.push_back(ThreadStack{});
    std::istringstream frame(line);
    std::string number, word, name;
    frame >> number >> word;  // "#3", then the address (or, in gdb's frame #0, the name)
    if (gdb) {
      // "#3  0x0000 in stopHere () at x.c:3" or "#0  stopHere () ..."
      const size_t in_ = line.find(" in ");
      std::string rest = in_ != std::string::npos ? line.substr(in_ + 4) : line.substr(line.find(word));
      name = rest.substr(0, rest.find(" ("));
    } else {
      std::getline(frame, name);
      name.erase(0, name.find_first_not_of(' '));
      const size_t module = name.find(" - ");
      if (module != std::string::npos) name.erase(module);
    }
    threads.back().frames.push_back(name.empty() ? "??" : name);
  }
  return threads;
}

std::string findProgram(const char* name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  std::istringstream in(dirs);
  std::string dir;
  while (std::getline(in, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::string runCapture(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  ::pclose(pipe);
  return out;
}

nlohmann::json recordJson(const flight::Record& r, int64_t nowNs) {
  nlohmann::json j = {{"seq", r.seq},        {"group", r.group},  {"op", r.op},
                      {"label", r.label},    {"dtype", r.dtype},  {"numel", r.numel},
                      {"peer", r.peer},      {"state", flight::stateName(r.state)}};
  j["age_s"] = static_cast<double>(nowNs - r.startNs) / 1e9;
  j["duration_s"] = r.endNs > 0 ? nlohmann::json(static_cast<double>(r.endNs - r.startNs) / 1e9) : nlohmann::json();
  return j;
}

}  // namespace

RankStack readStack(pid_t pid, double timeoutS) {
  RankStack stack;
  const std::string timeout = findProgram("timeout");
  const std::string limit = timeout.empty() ? "" : timeout + " -s KILL " + std::to_string(timeoutS) + " ";
  if (const std::string eu = findProgram("eu-stack"); !eu.empty()) {
    stack.threads = parseStack(runCapture(limit + eu + " -p " + std::to_string(pid) + " 2>/dev/null"), false);
    stack.tool = "eu-stack";
  } else if (const std::string gdb = findProgram("gdb"); !gdb.empty()) {
    stack.threads = parseStack(runCapture(limit + gdb + " -nx -batch -p " + std::to_string(pid) +
                                          " -ex 'thread apply all bt' 2>/dev/null"), true);
    stack.tool = "gdb";
  } else {
    stack.error = "no eu-stack (Debian: elfutils) or gdb on PATH";
    return stack;
  }
  if (stack.threads.empty()) {
    stack.error = stack.tool + " could not read it (ptrace not permitted? see /proc/sys/kernel/yama/ptrace_scope)";
    return stack;
  }
  // The main thread (tid == pid) first.
  std::stable_partition(stack.threads.begin(), stack.threads.end(), [pid](const ThreadStack& t) { return t.tid == pid; });
  return stack;
}

HangFinding analyseRings(const std::vector<RankRing>& ranks, int64_t nowNs, int64_t stallAfterMs,
                         int64_t awakeSinceNs) {
  HangFinding f;
  std::vector<std::map<uint64_t, const flight::Record*>> records;
  for (const RankRing& rank : ranks) records.push_back(worldRecords(rank));
  uint64_t maxEntered = 0, minEntered = UINT64_MAX, window = 0;
  bool sawTimeout = false;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (!ranks[i].ring.valid) continue;
    for (const flight::Record& r : ranks[i].ring.records) {
      if (r.state == flight::State::kTimedOut) sawTimeout = true;
      if (r.state == flight::State::kTimedOut || r.state == flight::State::kFailed) f.timedOut = true;
      const int64_t limitMs = stallAfterMs > 0 ? stallAfterMs : ranks[i].ring.timeoutMs + kStallGraceMs;
      if (r.state == flight::State::kRunning && !ranks[i].exited && ranks[i].ring.timeoutMs > 0 &&
          nowNs - std::max(r.startNs, awakeSinceNs) > limitMs * 1000000) {
        f.stall = true;
      }
    }
    const uint64_t entered = records[i].empty() ? 0 : records[i].rbegin()->first;
    const uint64_t first = records[i].empty() ? 0 : records[i].begin()->first;
    maxEntered = std::max(maxEntered, entered);
    minEntered = std::min(minEntered, entered);
    window = std::max(window, first);
  }
  f.failedOnly = f.timedOut && !sawTimeout;
  if (maxEntered == 0) return f;
  // Behind: ranks that never entered the last collective others entered.
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (!ranks[i].ring.valid) continue;
    const uint64_t entered = records[i].empty() ? 0 : records[i].rbegin()->first;
    if (entered < maxEntered) f.behind.push_back(ranks[i].rank);
  }
  if (!f.behind.empty()) {
    f.missingSeq = minEntered + 1;
    for (size_t i = 0; i < ranks.size(); ++i) {
      auto it = records[i].find(f.missingSeq);
      if (it == records[i].end()) continue;
      if (!f.missing) f.missing = *it->second;
      f.ahead.push_back(ranks[i].rank);
    }
  }
  // The first sequence number every rank entered whose calls differ.
  for (uint64_t seq = std::max<uint64_t>(window, 1); seq <= minEntered && f.mismatchSeq == 0; ++seq) {
    std::vector<std::pair<int, flight::Record>> calls;
    for (size_t i = 0; i < ranks.size(); ++i) {
      auto it = records[i].find(seq);
      if (it != records[i].end()) calls.emplace_back(ranks[i].rank, *it->second);
    }
    if (calls.size() < 2) continue;
    const flight::Record& a = calls.front().second;
    for (const auto& [rank, b] : calls) {
      std::string kind;
      if (a.op != b.op) {
        kind = "different collectives";
      } else if (pointToPoint(a)) {
        continue;  // a send pairs with a recv: nothing to compare
      } else if (a.numel != b.numel) {
        kind = "different sizes";
      } else if (a.dtype != b.dtype) {
        kind = "different dtypes";
      } else if (a.op == "broadcast" && a.peer != b.peer) {
        kind = "different roots";
      }
      if (kind.empty()) continue;
      f.mismatchSeq = seq;
      f.mismatchKind = kind;
      f.mismatchCalls = calls;
      break;
    }
  }
  // Whose stack to show.
  if (!f.behind.empty()) {
    f.lagging = f.behind;
  } else {
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (records[i].empty() || ranks[i].exited) continue;
      if (records[i].rbegin()->second->state != flight::State::kDone) f.lagging.push_back(ranks[i].rank);
    }
  }
  if (f.lagging.size() > kMaxStacks) f.lagging.resize(kMaxStacks);
  return f;
}

std::vector<std::string> formatHangReport(const std::vector<RankRing>& ranks, const HangFinding& f,
                                          const std::vector<std::pair<int, RankStack>>& stacks, int64_t nowNs) {
  std::vector<std::string> lines;
  // A mismatch the backend saw at once fails the collective without a timeout: named as what it is.
  const std::string why = f.mismatchSeq != 0 && (!f.timedOut || f.failedOnly) ? "collectives do not pair"
                          : f.timedOut && f.failedOnly                       ? "a collective failed (a peer's connection broke)"
                          : f.timedOut                                       ? "a collective timed out"
                          : f.stall                                          ? "a collective stalls"
                                                                             : "collectives do not pair";
  lines.push_back("hang report (" + why + "; the flight recorder of the " + std::to_string(ranks.size()) +
                  " ranks on this node, world group):");
  for (const RankRing& rank : ranks) {
    std::string line = "  rank " + std::to_string(rank.rank) + " (pid " + std::to_string(rank.pid) + ", " +
                       stateOf(rank) + "): ";
    if (!rank.ring.valid) {
      lines.push_back(line + "no record (it had not created its process group)");
      continue;
    }
    const auto records = worldRecords(rank);
    if (records.empty()) {
      lines.push_back(line + "no collective yet");
      continue;
    }
    const flight::Record& last = *records.rbegin()->second;
    line += "last entered " + describe(last) + ", " + flight::stateName(last.state);
    if (last.state == flight::State::kRunning) line += " for " + seconds(nowNs - last.startNs);
    else if (last.endNs > 0) line += " after " + seconds(last.endNs - last.startNs);
    line += "; last finished #" + std::to_string(lastFinished(records));
    lines.push_back(line);
  }
  if (!f.behind.empty() && f.missing) {
    const bool one = f.behind.size() == 1;
    lines.push_back((one ? "rank " : "ranks ") + rankList(f.behind) + (one ? " is" : " are") +
                    " behind: never entered " + describe(*f.missing) + ", which " +
                    (f.ahead.size() == 1 ? "rank " : "ranks ") + rankList(f.ahead) + " entered " +
                    seconds(nowNs - f.missing->startNs) + " ago; " + (one ? "its" : "their") +
                    " stack below shows where " + (one ? "it is" : "they are"));
  }
  if (f.mismatchSeq != 0) {
    std::string calls;
    for (const auto& [rank, r] : f.mismatchCalls) {
      calls += (calls.empty() ? "" : "; ") + std::string("rank ") + std::to_string(rank) + " " + describe(r);
    }
    std::string hint;
    if (f.mismatchKind == "different collectives") {
      hint = "a collective called on some ranks only (a conditional all-reduce, or a step, evaluation or checkpoint "
             "through the DDP wrapper on one rank): every rank must run the same collectives in the same order";
    } else if (f.mismatchKind == "different sizes") {
      hint = "the same collective over tensors of different sizes: a different model (or tensor shape) on one rank";
    } else if (f.mismatchKind == "different dtypes") {
      hint = "the same collective over tensors of different dtypes (float on one rank, double on another: a .to() "
             "or a mixed-precision setting on some ranks only)";
    } else {
      hint = "a broadcast from different roots: every rank must name the same root";
    }
    lines.push_back("collectives do not pair at #" + std::to_string(f.mismatchSeq) + " (" + f.mismatchKind + "): " +
                    calls + ": " + hint);
  }
  for (const auto& [rank, stack] : stacks) {
    if (stack.threads.empty()) {
      lines.push_back("stack of rank " + std::to_string(rank) + ": unavailable, " + stack.error);
      continue;
    }
    const ThreadStack& main = stack.threads.front();
    lines.push_back("stack of rank " + std::to_string(rank) + " (main thread " + std::to_string(main.tid) + ", by " +
                    stack.tool + "; all " + std::to_string(stack.threads.size()) + " threads in hang_report.json):");
    for (size_t i = 0; i < main.frames.size() && i < kLoggedFrames; ++i) {
      lines.push_back("  #" + std::to_string(i) + " " + main.frames[i]);
    }
    if (main.frames.size() > kLoggedFrames) lines.push_back("  ... " + std::to_string(main.frames.size() - kLoggedFrames) + " more");
  }
  return lines;
}

std::string hangReportJson(const std::vector<RankRing>& ranks, const HangFinding& f,
                           const std::vector<std::pair<int, RankStack>>& stacks, const std::vector<std::string>& lines,
                           int64_t nowNs) {
  nlohmann::json j;
  j["version"] = 1;
  j["reason"] = f.timedOut ? "timeout" : f.stall ? "stall" : "mismatch";
  j["summary"] = lines;
  nlohmann::json rankList = nlohmann::json::array();
  for (const RankRing& rank : ranks) {
    nlohmann::json r = {{"rank", rank.rank}, {"pid", rank.pid}, {"state", stateOf(rank)}};
    r["stopped"] = rank.stopped;
    r["exited"] = rank.exited;
    const auto records = worldRecords(rank);
    r["last_entered"] = records.empty() ? nlohmann::json() : recordJson(*records.rbegin()->second, nowNs);
    r["last_entered_seq"] = records.empty() ? 0 : records.rbegin()->first;
    r["last_finished_seq"] = lastFinished(records);
    nlohmann::json recent = nlohmann::json::array();
    for (const flight::Record& rec : rank.ring.records) recent.push_back(recordJson(rec, nowNs));
    r["collectives"] = recent;  // oldest first, every group
    r["backend"] = rank.ring.backend;
    r["timeout_s"] = static_cast<double>(rank.ring.timeoutMs) / 1000.0;
    for (const auto& [which, stack] : stacks) {
      if (which != rank.rank) continue;
      nlohmann::json threads = nlohmann::json::array();
      for (const ThreadStack& t : stack.threads) threads.push_back({{"tid", t.tid}, {"frames", t.frames}});
      r["stack"] = {{"tool", stack.tool}, {"error", stack.error}, {"threads", threads}};
    }
    rankList.push_back(r);
  }
  j["ranks"] = rankList;
  j["behind"] = f.behind;
  j["ahead"] = f.ahead;
  j["missing"] = f.missing ? recordJson(*f.missing, nowNs) : nlohmann::json();
  if (f.mismatchSeq != 0) {
    nlohmann::json calls = nlohmann::json::array();
    for (const auto& [rank, r] : f.mismatchCalls) {
      nlohmann::json c = recordJson(r, nowNs);
      c["rank"] = rank;
      calls.push_back(c);
    }
    j["mismatch"] = {{"seq", f.mismatchSeq}, {"kind", f.mismatchKind}, {"calls", calls}};
  } else {
    j["mismatch"] = nullptr;
  }
  return j.dump(2) + "\n";
}

bool reportHang(const std::vector<RankRing>& ranks, bool stallOnly, int64_t awakeSinceNs) {
  const int64_t now = flight::nowNs();
  const HangFinding finding = analyseRings(ranks, now, /*stallAfterMs=*/0, awakeSinceNs);
  if (stallOnly ? !finding.stall : !finding.relevant()) return false;
  std::vector<std::pair<int, RankStack>> stacks;
  for (int rank : finding.lagging) {
    for (const RankRing& r : ranks) {
      if (r.rank != rank || r.exited) continue;
      stacks.emplace_back(rank, readStack(r.pid));
      // The stack tool (eu-stack, gdb) attaches with ptrace, and its detach can resume a rank that
      // was stopped (state T): stopped again at once, as the report found it (the launcher's
      // unreaped child: the pid is its). At once: a SIGCONT from outside after this is left alone.
      if (r.stopped) ::kill(r.pid, SIGSTOP);
    }
  }
  std::vector<std::string> lines = formatHangReport(ranks, finding, stacks, now);
  std::string dir;
  for (const RankRing& r : ranks) {
    if (r.ring.valid && !r.ring.reportDir.empty()) {
      dir = r.ring.reportDir;
      break;
    }
  }
  if (!dir.empty()) {
    const std::string path = dir + "/hang_report.json";
    const std::string temp = path + ".tmp." + std::to_string(::getpid());
    ::mkdir(dir.c_str(), 0755);
    ::unlink(temp.c_str());  // never through a link planted under the temporary name (unlink drops the link)
    std::ofstream out;
    if (claimFile(temp, /*append=*/false).empty()) out.open(temp, std::ios::trunc);
    out << hangReportJson(ranks, finding, stacks, lines, now);
    out.close();
    if (out && std::rename(temp.c_str(), path.c_str()) == 0) {
      lines.push_back("hang report written to " + path);
    } else {
      std::remove(temp.c_str());
      lines.push_back("could not write " + path + " (" + std::strerror(errno) + ")");
    }
  }
  for (const std::string& line : lines) spdlog::error("{}", line);
  return true;
}

}  // namespace ddp::launcher
