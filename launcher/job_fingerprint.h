// What every node of an elastic job must agree on, compared when a node arrives (issue 46 (9)): a
// node started with another --nproc_per_node, another worker or other arguments is refused with
// one line before it joins, and the running round goes on. Without this check it was admitted, the
// running nodes stopped their workers for it, and the job ended on every node.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "launcher/launch_options.h"

namespace ddp::launcher {

/// ("--nproc_per_node", "2"), ("the worker", "worker"), ("argument 1", ...): what is compared, in
/// order. A worker argument that names a regular file (up to 1 MiB) counts by its content, so the
/// same config under another path agrees and another config under the same path does not.
struct JobFingerprint {
  std::vector<std::pair<std::string, std::string>> items;

  /// One "name\tvalue" line per item: what the rendezvous store keeps.
  std::string text() const;
  static JobFingerprint parse(const std::string& text);
};

JobFingerprint fingerprintOf(const LaunchOptions& options);

/// The first item where `mine` differs from `job`'s, as one sentence, or nothing when they agree.
std::optional<std::string> firstDifference(const JobFingerprint& job, const JobFingerprint& mine);

}  // namespace ddp::launcher
