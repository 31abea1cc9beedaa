// The launcher's command line cut into its own tokens and the worker's (WORKER and what follows
// it), before cxxopts reads the launcher's: cxxopts would parse flags among the worker's arguments.
#pragma once

#include <cstddef>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ddp::launcher::detail {

/// The launcher's flags as cxxopts describes them.
struct OptionTable {
  std::set<std::string> names;         // long and short names
  std::set<std::string> takesValue;    // names whose value may be the next argument
};

/// " (did you mean '--nproc_per_node'?)" for a flag a few edits from `unknown`, "" for none.
std::string suggestion(const std::string& unknown, const std::set<std::string>& names);

/// The one name of `names` that `name` (a long option's, as `arg` spelled it) is a prefix of, as
/// torchrun's argparse accepts abbreviations ("nnode" -> "nnodes"); `name` itself when none is;
/// ConfigError naming the candidates when several are.
std::string unabbreviated(const std::string& arg, const std::string& name, const std::set<std::string>& names);

// "--nproc-per-node=4" -> name "nproc_per_node", value "4".
struct OptionToken {
  std::string name;
  std::optional<std::string> value;
  bool isLong = false;
};
OptionToken splitOption(const std::string& arg);

// Splits argv at WORKER by hand: cxxopts would parse flags inside the worker's own arguments.
struct SplitArgs {
  std::vector<std::string> launcherArgs;  // normalised option tokens (and their values)
  std::optional<std::string> worker;
  std::vector<std::string> workerArgs;
};

/// The launcher's tokens (normalised: "--nproc-per-node 4" -> "--nproc_per_node", "4"), and WORKER
/// with its arguments. ConfigError for an unknown flag (with a suggestion), a torchrun flag with no
/// meaning here, or a flag without its value.
SplitArgs splitAtWorker(const std::vector<std::string>& args, const OptionTable& table);

/// The long names of the flags among splitAtWorker's tokens (values skipped), for the PET_* defaults.
std::set<std::string> givenFlags(const std::vector<std::string>& launcherArgs);

}  // namespace ddp::launcher::detail
