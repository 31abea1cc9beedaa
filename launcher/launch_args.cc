#include "launcher/launch_args.h"

#include <algorithm>
#include <map>

#include "common/edit_distance.h"
#include "common/error.h"
#include "launcher/torchrun_compat.h"

namespace ddp::launcher::detail {

std::string suggestion(const std::string& unknown, const std::set<std::string>& names) {
  std::string best;
  size_t bestDistance = std::max<size_t>(3, unknown.size() / 3) + 1;
  for (const std::string& name : names) {
    if (name.size() < 2) continue;
    const size_t distance = editDistance(unknown, name);
    if (distance < bestDistance) {
      bestDistance = distance;
      best = name;
    }
  }
  return best.empty() ? "" : " (did you mean '--" + best + "'?)";
}

std::string unabbreviated(const std::string& arg, const std::string& name, const std::set<std::string>& names) {
  // torchrun's argparse takes an unambiguous prefix of a long option (allow_abbrev): --nnode=2.
  std::vector<std::string> matches;
  for (const std::string& candidate : names) {
    if (candidate.size() > 1 && candidate.rfind(name, 0) == 0) matches.push_back(candidate);
  }
  if (matches.size() == 1 || name.empty()) return matches.size() == 1 ? matches[0] : name;
  if (matches.size() > 1) {
    std::string list;
    for (const std::string& m : matches) list += (list.empty() ? "--" : ", --") + m;
    DDP_THROW(ConfigError, "ambiguous option '", arg, "' could match ", list, "; spell the option out");
  }
  return name;
}

OptionToken splitOption(const std::string& arg) {
  OptionToken token;
  token.isLong = arg.rfind("--", 0) == 0;
  const std::string body = arg.substr(token.isLong ? 2 : 1);
  const size_t equals = body.find('=');
  token.name = body.substr(0, equals);
  if (equals != std::string::npos) token.value = body.substr(equals + 1);
  std::replace(token.name.begin(), token.name.end(), '-', '_');
  return token;
}

SplitArgs splitAtWorker(const std::vector<std::string>& args, const OptionTable& table) {
  SplitArgs split;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      if (i + 1 < args.size()) {
        split.worker = args[i + 1];
        split.workerArgs.assign(args.begin() + static_cast<long>(i) + 2, args.end());
      }
      return split;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      split.worker = arg;
      split.workerArgs.assign(args.begin() + static_cast<long>(i) + 1, args.end());
      // As torchrun's argparse: a "--" right after the script ends the launcher's options, and goes
      // (`torchrun s.py -- --x`: s.py gets --x), unless a "--" before the script did that already.
      if (!split.workerArgs.empty() && split.workerArgs.front() == "--") split.workerArgs.erase(split.workerArgs.begin());
      return split;
    }
    OptionToken token = splitOption(arg);
    if (token.isLong && table.names.count(token.name) == 0) token.name = unabbreviated(arg, token.name, table.names);
    if (const auto instead = torchrun::unsupportedFlag(token.name)) DDP_THROW(ConfigError, *instead);
    if (table.names.count(token.name) == 0 || (token.isLong && token.name.size() == 1)) {
      DDP_THROW(ConfigError, "unknown option '", arg, "'", suggestion(token.name, table.names),
                "; run ddp-launch --help for the list (the worker's own options go after WORKER)");
    }
    if (!token.isLong && token.name.size() > 1) {  // `-nproc_per_node=2`: read as the letters -n -p -r ...
      DDP_THROW(ConfigError, "option '", arg, "' has one dash; long options take two: --", arg.substr(1));
    }
    std::string normalised = (token.isLong ? "--" : "-") + token.name;
    if (token.value) normalised += "=" + *token.value;
    split.launcherArgs.push_back(normalised);
    // torchrun's `--tee 3` / `-t 3`: our --tee also stands alone, so only a tee value is taken.
    const bool teeValueNext = (token.name == "tee" || token.name == "t") && !token.value && i + 1 < args.size() &&
                              (args[i + 1] == "0" || args[i + 1] == "1" || args[i + 1] == "2" || args[i + 1] == "3");
    if (teeValueNext) {
      split.launcherArgs.back() = "--tee=" + args[++i];
      continue;
    }
    if (!token.value && table.takesValue.count(token.name) != 0) {
      if (i + 1 >= args.size()) {
        DDP_THROW(ConfigError, "option '", arg, "' needs a value, e.g. --", token.name, "=VALUE");
      }
      split.launcherArgs.push_back(args[++i]);
    }
  }
  return split;
}

std::set<std::string> givenFlags(const std::vector<std::string>& launcherArgs) {
  static const std::map<std::string, std::string> kLong = {{"m", "module"}, {"r", "redirects"}, {"t", "tee"},
                                                           {"h", "help"}};
  std::set<std::string> given;
  for (const std::string& arg : launcherArgs) {
    if (arg.size() < 2 || arg[0] != '-') continue;  // a value of the flag before
    std::string name = arg.substr(arg[1] == '-' ? 2 : 1);
    name = name.substr(0, name.find('='));
    const auto longName = kLong.find(name);
    given.insert(longName == kLong.end() ? name : longName->second);
  }
  return given;
}

}  // namespace ddp::launcher::detail
