#include "launcher/job_fingerprint.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "common/sha256.h"

namespace ddp::launcher {
namespace {

constexpr off_t kMaxHashedFile = 1 << 20;
constexpr char kFilePrefix[] = "a file with sha256 ";

// An argument as compared: a small regular file by its content, anything else as written.
std::string argumentValue(const std::string& arg) {
  struct stat info {};
  if (::stat(arg.c_str(), &info) != 0 || !S_ISREG(info.st_mode) || info.st_size > kMaxHashedFile) return arg;
  std::ifstream in(arg, std::ios::binary);
  if (!in) return arg;
  std::ostringstream content;
  content << in.rdbuf();
  return kFilePrefix + crypto::toHex(crypto::sha256(content.str()));
}

std::string baseName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// How a value reads in the refusal: files by what they are, the rest quoted.
std::string shown(const std::string& value) {
  if (value.rfind(kFilePrefix, 0) == 0) return "a file (sha256 " + value.substr(sizeof(kFilePrefix) - 1, 12) + "...)";
  return "'" + value + "'";
}

}  // namespace

std::string JobFingerprint::text() const {
  std::string out;
  for (const auto& [name, value] : items) out += name + "\t" + value + "\n";
  return out;
}

JobFingerprint JobFingerprint::parse(const std::string& text) {
  JobFingerprint fingerprint;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t tab = line.find('\t');
    if (tab == std::string::npos) continue;
    fingerprint.items.emplace_back(line.substr(0, tab), line.substr(tab + 1));
  }
  return fingerprint;
}

JobFingerprint fingerprintOf(const LaunchOptions& options) {
  JobFingerprint fingerprint;
  auto add = [&](std::string name, std::string value) { fingerprint.items.emplace_back(std::move(name), std::move(value)); };
  add("--nproc_per_node", std::to_string(options.nprocPerNode));
  add("--nnodes", std::to_string(options.elastic.minNodes) + ":" + std::to_string(options.elastic.maxNodes));
  add("--max_restarts", std::to_string(options.maxRestarts));
  add("the worker", baseName(options.worker));
  add("the number of worker arguments", std::to_string(options.workerArgs.size()));
  for (size_t i = 0; i < options.workerArgs.size(); ++i) {
    add("worker argument " + std::to_string(i + 1), argumentValue(options.workerArgs[i]));
  }
  return fingerprint;
}

std::optional<std::string> firstDifference(const JobFingerprint& job, const JobFingerprint& mine) {
  for (const auto& [name, value] : mine.items) {
    std::optional<std::string> theirs;
    for (const auto& [jobName, jobValue] : job.items) {
      if (jobName == name) theirs = jobValue;
    }
    if (!theirs) return name + " is not known to the job (a launcher of another version started it)";
    if (*theirs != value) return name + " is " + shown(value) + " here but " + shown(*theirs) + " in the job";
  }
  return std::nullopt;
}

}  // namespace ddp::launcher
