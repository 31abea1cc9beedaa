#include "worker/config/config.h"

#include <yaml-cpp/yaml.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <iterator>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "common/edit_distance.h"
#include "common/error.h"
#include "worker/config/config_fields.h"
#include "worker/config/config_rules.h"

namespace ddp::worker {
namespace {

// The key meant by an unknown `key`: first one it names by its last part in another section
// (`n_layer`: model.n_layer, `chekpoint.dir`: checkpoint.dir) or begins (`generate.temp`:
// generate.temperature), else one a few edits away; among several the fewest edits, then the
// longest shared start (`data.sample`: data.sampling, not data.name). Empty: none is close.
std::string closestKey(const std::string& key, const std::vector<Field>& fields) {
  const auto leaf = [](const std::string& k) { return k.substr(k.rfind('.') + 1); };
  const auto sharedStart = [&](const std::string& k) {
    std::size_t n = 0;
    while (n < k.size() && n < key.size() && k[n] == key[n]) ++n;
    return n;
  };
  const std::size_t nearby = std::max<std::size_t>(2, key.size() / 3);
  std::string best;
  std::tuple<int, std::size_t, std::size_t> bestScore{2, 0, 0};  // (tier, edits, -shared start): lower wins
  for (const auto& f : fields) {
    const std::size_t edits = editDistance(key, f.key);
    const bool named = leaf(f.key) == leaf(key) || (key.size() >= 4 && f.key.rfind(key, 0) == 0);
    const int tier = named ? 0 : edits <= nearby ? 1 : 2;
    const std::tuple<int, std::size_t, std::size_t> score{tier, edits, key.size() - sharedStart(f.key)};
    if (tier < 2 && score < bestScore) {
      bestScore = score;
      best = f.key;
    }
  }
  return best;
}

[[noreturn]] void unknownKey(const std::string& key, const std::vector<Field>& fields,
                             const std::string& origin) {
  const std::string best = closestKey(key, fields);
  std::string hint = best.empty() ? " (see docs/configuration.md)"
                                  : " (did you mean '" + best + "'?)";
  DDP_THROW(ConfigError, "config: unknown key '", key, "'", origin, hint);
}

// `train: 5`, `train: ~`, `model: []`: a section given something other than a map of keys.
void notASection(const std::string& key, const YAML::Node& value, const std::vector<Field>& fields,
                 const std::string& origin) {
  const auto member = std::find_if(fields.begin(), fields.end(),
                                   [&](const Field& f) { return f.key.rfind(key + ".", 0) == 0; });
  if (member == fields.end()) return;
  std::string got = "nothing";
  if (value.IsSequence()) got = "a list";
  else if (value.IsScalar()) got = "'" + value.Scalar() + "'";
  DDP_THROW(ConfigError, "config: '", key, "'", origin, " must be a map of keys such as ", member->key,
            " (got ", got, ")");
}

// Text for a one-line message: line breaks as \n.
std::string oneLine(std::string text) {
  for (size_t at = text.find('\n'); at != std::string::npos; at = text.find('\n', at + 2)) text.replace(at, 1, "\\n");
  return text;
}

void setField(const Field& field, const YAML::Node& value, const std::string& origin) {
  try {
    field.set(value);
  } catch (const YAML::Exception&) {
    std::string shown = value.IsScalar() ? "'" + oneLine(value.Scalar()) + "'" : "a " + std::string(value.IsSequence() ? "list" : value.IsMap() ? "map" : "null");
    const char* article = field.type.find_first_of("aeiou") == 0 ? " must be an " : " must be a ";
    DDP_THROW(ConfigError, "config: '", field.key, "'", origin, article, field.type,
              ", got ", shown);
  }
}

// Walks maps only: a list or a scalar is one key's value. yaml-cpp keeps every entry of a
// map with a repeated key (lookups see the first, iteration all), so repeats are caught here.
void flatten(const YAML::Node& node, const std::string& prefix,
             std::vector<std::pair<std::string, YAML::Node>>& out, const std::string& origin,
             std::set<std::string>& seen) {
  const auto once = [&](const std::string& key) {
    if (!seen.insert(key).second) {
      const std::string shown = key.back() == ':' ? key.substr(0, key.size() - 1) : key;
      DDP_THROW(ConfigError, "config: key '", shown, "' is given twice", origin, "; keep one of them");
    }
  };
  if (node.IsMap()) {
    if (!prefix.empty()) once(prefix + ":");  // a section given twice ("train:" ... "train:")
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      flatten(kv.second, prefix.empty() ? key : prefix + "." + key, out, origin, seen);
    }
    return;
  }
  once(prefix);
  out.emplace_back(prefix, node);
}

const Field* findField(const std::vector<Field>& fields, const std::string& key) {
  auto it = std::find_if(fields.begin(), fields.end(), [&](const Field& f) { return f.key == key; });
  return it == fields.end() ? nullptr : &*it;
}

// A config is a short YAML file; anything larger is the wrong path (/dev/zero, a data file).
constexpr size_t kMaxConfigBytes = 1u << 20;
// train.zero is train.sharding: zero1's alias: the one set decides; both set must agree.
void resolveSharding(TrainConfig& t, const std::set<std::string>& set) {
  const bool zeroSet = set.count("train.zero") > 0, shardingSet = set.count("train.sharding") > 0;
  if (zeroSet && shardingSet && t.zero != (t.sharding == Sharding::kZero1)) {
    DDP_THROW(ConfigError, "config: 'train.zero' is ", t.zero ? "true" : "false", " but 'train.sharding' is ",
              shardingName(t.sharding), "; train.zero: true is train.sharding: zero1, set only train.sharding");
  }
  if (zeroSet && !shardingSet) t.sharding = t.zero ? Sharding::kZero1 : Sharding::kNone;
  t.zero = t.sharding == Sharding::kZero1;
}

// An override's value parses as YAML (numbers, lists, quotes), but a string key keeps its text as
// given: a glob ('*.bin' is an alias to YAML), a prompt ('%', '#x' and 'The end: 42' are a
// directive, a comment and a map; leading spaces, a blank line, '- x' and '|' YAML would change).
// A quoted value ("..." or '...') is YAML's; `key=` and the null words keep YAML's meaning: the
// key's default.
// An image folder's data.mean / data.std left empty: the values the job uses, so that
// config.resolved.yaml says them (ImageNet's with data.train_transform imagenet, else 0 and 1).
void resolveNormalisation(DataConfig& d) {
  if (d.name != "image_folder") return;
  const bool imagenet = d.trainTransform == "imagenet";
  if (d.mean.empty()) d.mean = imagenet ? std::vector<float>{0.485f, 0.456f, 0.406f} : std::vector<float>{0, 0, 0};
  if (d.stddev.empty()) d.stddev = imagenet ? std::vector<float>{0.229f, 0.224f, 0.225f} : std::vector<float>{1, 1, 1};
}

YAML::Node overrideValue(const Field& field, const std::string& text, const std::string& whole) {
  const bool isString = field.type == "string";
  YAML::Node value;
  try {
    value = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    if (isString) return YAML::Node(text);
    DDP_THROW(ConfigError, "config: override '", oneLine(whole), "' has a malformed value: ", e.msg);
  }
  static const std::set<std::string> kNullWords = {"~", "null", "Null", "NULL"};
  // A string key's text as given (a prompt's spaces, tabs and blank lines; '&x', '- x', '|'),
  // unless it is quoted YAML ("...", '...': the quotes go, escapes apply) or empty / a null word.
  const bool quoted = !text.empty() && (text.front() == '"' || text.front() == '\'') && value.IsScalar();
  if (isString && !text.empty() && kNullWords.count(text) == 0 && !quoted) return YAML::Node(text);
  return value;
}

WorkerConfig build(const YAML::Node& root, const std::vector<std::string>& overrides,
                   const std::string& origin) {
  WorkerConfig config;
  std::set<std::string> setKeys;  // the keys the file or an override set
  auto fields = fieldsOf(config);
  if (root && !root.IsNull()) {
    if (!root.IsMap()) DDP_THROW(ConfigError, "config", origin, ": the top level must be a map of keys");
    std::vector<std::pair<std::string, YAML::Node>> flat;
    std::set<std::string> seen;
    flatten(root, "", flat, origin, seen);
    for (const auto& [key, value] : flat) {
      const Field* f = findField(fields, key);
      if (f == nullptr) notASection(key, value, fields, origin);
      if (f == nullptr) unknownKey(key, fields, origin);
      setField(*f, value, origin);
      setKeys.insert(f->key);
    }
  }
  // `train.lr = 0.1`, `train.lr =0.1`, `train.lr= 0.1`: the shell made several arguments of one
  // override. Said before any is applied (`train.lr=` alone is an empty value, refused otherwise).
  for (size_t i = 0; i + 1 < overrides.size(); ++i) {
    const std::string& o = overrides[i];
    const std::string& next = overrides[i + 1];
    if (o.find('=') == std::string::npos && next.rfind('=', 0) == 0) {
      DDP_THROW(ConfigError, "config: override '", oneLine(o), "' is followed by '", oneLine(next),
                "': write each override as one argument, without spaces around '=': ", oneLine(o), "=VALUE");
    }
    if (!o.empty() && o.back() == '=' && o.find('=') == o.size() - 1 && next.find('=') == std::string::npos) {
      DDP_THROW(ConfigError, "config: '", oneLine(next), "' follows the override '", oneLine(o),
                "': write each override as one argument, without spaces around '=': ", oneLine(o), oneLine(next));
    }
  }
  for (const auto& o : overrides) {
    const auto eq = o.find('=');
    if (eq == std::string::npos || eq == 0) {
      DDP_THROW(ConfigError, "config: override '", oneLine(o), "' must look like dotted.key=value, e.g. train.lr=0.1");
    }
    const std::string key = o.substr(0, eq);
    const Field* f = findField(fields, key);
    if (f == nullptr) unknownKey(key, fields, " (command-line override)");
    setField(*f, overrideValue(*f, o.substr(eq + 1), o), " (command-line override)");
    setKeys.insert(f->key);
  }
  resolveSharding(config.train, setKeys);
  validateConfig(config);
  resolveNormalisation(config.data);
  return config;
}

}  // namespace

const char* shardingName(Sharding sharding) {
  switch (sharding) {
    case Sharding::kZero1: return "zero1";
    case Sharding::kZero2: return "zero2";
    case Sharding::kFull: return "full";
    case Sharding::kNone: break;
  }
  return "none";
}

std::optional<Sharding> parseSharding(std::string_view name) {
  for (const Sharding s : {Sharding::kNone, Sharding::kZero1, Sharding::kZero2, Sharding::kFull}) {
    if (name == shardingName(s)) return s;
  }
  return std::nullopt;
}

std::string checkpointDir(const WorkerConfig& config) {
  return config.checkpoint.dir.empty() ? config.output.dir + "/checkpoints" : config.checkpoint.dir;
}

std::string modeName(Mode mode) {
  switch (mode) {
    case Mode::kDdp: return "ddp";
    case Mode::kDp: return "dp";
    case Mode::kSingle: return "single";
    case Mode::kEval: return "eval";
    case Mode::kGenerate: return "generate";
  }
  return "?";
}

WorkerConfig parseConfig(const std::string& yamlText, const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(yamlText);
  } catch (const YAML::Exception& e) {
    DDP_THROW(ConfigError, "config: YAML syntax error at line ", e.mark.line + 1, ": ", e.msg);
  }
  return build(root, overrides, "");
}

WorkerConfig loadConfig(const std::string& path, const std::vector<std::string>& overrides) {
  // A named pipe without a writer would block the open below for ever.
  struct stat pipeInfo {};
  if (::stat(path.c_str(), &pipeInfo) == 0 && (S_ISFIFO(pipeInfo.st_mode) || S_ISSOCK(pipeInfo.st_mode))) {
    DDP_THROW(ConfigError, "config: '", path, "' is a ", S_ISFIFO(pipeInfo.st_mode) ? "named pipe" : "socket",
              ", not a file; pass the path of a YAML config such as configs/fmnist_cnn_ddp.yaml");
  }
  std::ifstream in(path);
  if (!in && ::stat(path.c_str(), &pipeInfo) != 0 && path.find('=') != std::string::npos) {
    // `worker train.lr=0.1`: the config file was left out, and the first override taken for it.
    DDP_THROW(ConfigError, "config: the first argument is the YAML config file, but '", path,
              "' looks like an override; put the config first: worker CONFIG.yaml ", path);
  }
  if (!in) DDP_THROW(ConfigError, "config: cannot read '", path, "'; pass the path of a YAML config such as configs/fmnist_cnn_ddp.yaml");
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    DDP_THROW(ConfigError, "config: '", path, "' is a directory; pass the path of a YAML config such as configs/fmnist_cnn_ddp.yaml");
  }
  // Read one byte past the limit: /dev/zero or a FIFO has no size to check beforehand.
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) DDP_THROW(ConfigError, "config: cannot read '", path, "' (", std::strerror(errno), ")");
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxConfigBytes) {
    DDP_THROW(ConfigError, "config: '", path, "' is larger than ", kMaxConfigBytes >> 20,
              " MiB; a config is a short YAML file (is this the right path?)");
  }
  YAML::Node root;
  try {
    const std::vector<YAML::Node> documents = YAML::LoadAll(text);
    if (documents.size() > 1) {
      DDP_THROW(ConfigError, "config: ", path, " holds ", documents.size(), " YAML documents (separated by '---'); "
                "a config is one document: merge them or keep one");
    }
    if (!documents.empty()) root = documents.front();
  } catch (const YAML::Exception& e) {
    DDP_THROW(ConfigError, "config: ", path, ":", e.mark.line + 1, ": YAML syntax error: ", e.msg);
  }
  return build(root, overrides, " in " + path);
}

std::string dumpConfig(const WorkerConfig& config) {
  WorkerConfig copy = config;
  // Keys are "top" or "section.key"; sections keep their first-seen order.
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string openSection;
  for (const auto& f : fieldsOf(copy)) {
    const auto dot = f.key.find('.');
    const std::string section = dot == std::string::npos ? "" : f.key.substr(0, dot);
    if (section != openSection) {
      if (!openSection.empty()) out << YAML::EndMap;
      if (!section.empty()) out << YAML::Key << section << YAML::Value << YAML::BeginMap;
      openSection = section;
    }
    const YAML::Node value = f.get();
    out << YAML::Key << (section.empty() ? f.key : f.key.substr(dot + 1));
    if (value.IsSequence()) {
      out << YAML::Value << YAML::Flow << value;
    } else {
      out << YAML::Value << value;
    }
  }
  if (!openSection.empty()) out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::vector<std::pair<std::string, std::string>> configValues(const WorkerConfig& config) {
  WorkerConfig copy = config;
  std::vector<std::pair<std::string, std::string>> values;
  for (const auto& f : fieldsOf(copy)) {
    YAML::Emitter out;
    out << YAML::Flow << f.get();
    values.emplace_back(f.key, out.c_str());
  }
  return values;
}

std::vector<std::string> configKeys() {
  WorkerConfig c;
  std::vector<std::string> keys;
  for (const auto& f : fieldsOf(c)) keys.push_back(f.key);
  return keys;
}

}  // namespace ddp::worker
