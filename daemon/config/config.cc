#include "daemon/config/config.h"

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "daemon/base/status.h"
#include "daemon/config/config_keys.h"

namespace ckptd {
namespace {

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("config: ", what));
}

// A scalar's text; a null (`key:` with nothing after it) reads as empty.
std::string ScalarText(const YAML::Node& node) { return node.IsNull() ? "" : node.Scalar(); }

// The node as the table's keys take it: a scalar, a sequence of scalars or a map of
// scalars; nested sequences and maps are refused naming the key.
absl::StatusOr<ConfigValue> ToValue(const std::string& name, const YAML::Node& node) {
  ConfigValue value;
  if (node.IsSequence()) {
    value.kind = ConfigValue::Kind::kList;
    for (const YAML::Node& item : node) {
      if (!item.IsScalar()) return Invalid(absl::StrCat(name, ": items must be single values"));
      value.list.push_back(item.Scalar());
    }
  } else if (node.IsMap()) {
    value.kind = ConfigValue::Kind::kMap;
    for (const auto& item : node) {
      if (!item.first.IsScalar() || !item.second.IsScalar()) {
        return Invalid(absl::StrCat(name, ": entries must map single values to single values"));
      }
      value.map.emplace_back(item.first.Scalar(), item.second.Scalar());
    }
  } else {
    value.scalar = ScalarText(node);
  }
  return value;
}

// True when some key lives under `section.` (commit, limits, ...).
bool IsSection(absl::string_view section) {
  for (const ConfigKey& key : ConfigKeys()) {
    if (absl::StartsWith(key.name, absl::StrCat(section, "."))) return true;
  }
  return false;
}

// Applies every key of the map `node`, whose keys are dotted under `prefix` ("" at the
// top level, "limits." in a section). Every key is tried: each mistake goes into
// *mistakes, so that one run names them all.
void ApplyMap(const std::string& prefix, const YAML::Node& node, DaemonConfig& config,
              std::vector<absl::Status>* mistakes) {
  for (const auto& item : node) {
    if (!item.first.IsScalar()) {
      mistakes->push_back(Invalid(absl::StrCat("keys must be names (under '", prefix, "')")));
      continue;
    }
    const std::string name = prefix + item.first.Scalar();
    if (const ConfigKey* key = FindConfigKey(name); key != nullptr) {
      absl::StatusOr<ConfigValue> value = ToValue(name, item.second);
      absl::Status s = value.ok() ? key->set(*value, name, config) : value.status();
      if (!s.ok()) mistakes->push_back(std::move(s));
    } else if (prefix.empty() && IsSection(name)) {
      if (item.second.IsMap()) {
        ApplyMap(name + ".", item.second, config, mistakes);
      } else {
        mistakes->push_back(Invalid(absl::StrCat(name, " must be a map")));
      }
    } else {
      mistakes->push_back(UnknownConfigKey(name));
    }
  }
}

}  // namespace

absl::StatusOr<DaemonConfig> ParseConfig(absl::string_view yaml_text) {
  DaemonConfig config;
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    return Invalid(e.what());  // malformed YAML: where, in yaml-cpp's words
  }
  if (root.IsNull()) return config;
  if (!root.IsMap()) return Invalid("top level must be a map");
  std::vector<absl::Status> mistakes;
  ApplyMap("", root, config, &mistakes);
  RETURN_IF_ERROR(JoinMistakes(mistakes));
  RETURN_IF_ERROR(ValidateConfig(config));
  return config;
}

absl::Status ValidateConfig(const DaemonConfig& config) {
  if (!config.tcp_address.empty() &&
      (config.tls_cert.empty() || config.tls_key.empty() || config.tls_ca.empty())) {
    return Invalid(
        "tcp.address needs tcp.tls_cert, tcp.tls_key and tcp.tls_ca: TCP is served only with mutual TLS");
  }
  if (config.replicas > 0 && config.storage != Storage::kLocal) {
    return Invalid("replicas: copies go to other hosts' local disks; they need storage: local");
  }
  if (config.redundancy == "parity") {
    if (config.replicas > 0) {
      return Invalid(
          "replicas and redundancy: parity are exclusive: choose full copies (replicas) or parity, not both");
    }
    if (config.storage != Storage::kLocal) {
      return Invalid("redundancy: parity protects hosts' local disks; it needs storage: local");
    }
    if (config.parity < 1 || config.parity >= config.parity_group) {
      return Invalid(absl::StrCat("parity: ", config.parity,
                                  " must be at least 1 and less than parity_group (", config.parity_group,
                                  ")"));
    }
  }
  if (!config.drain_to.empty()) {
    if (absl::StrContains(config.drain_to, "{rank}")) {
      return Invalid("drain_to: one directory every host shares; {rank} has no place in it");
    }
    auto within = [](absl::string_view inner, absl::string_view outer) {
      absl::ConsumeSuffix(&outer, "/");
      absl::ConsumeSuffix(&inner, "/");
      return inner == outer || absl::StartsWith(inner, absl::StrCat(outer, "/"));
    };
    if (within(config.drain_to, config.root) || within(config.root, config.drain_to)) {
      return Invalid(absl::StrCat("drain_to ", config.drain_to, " and root ", config.root,
                                  " must be separate directories, neither inside the other"));
    }
  }
  return absl::OkStatus();
}

std::string EffectiveConfigYaml(const DaemonConfig& config) {
  std::string yaml;
  std::string section;  // the section whose keys are being printed, "" at the top level
  for (const ConfigKey& key : ConfigKeys()) {
    const size_t dot = key.name.find('.');
    const std::string key_section = dot == std::string::npos ? "" : key.name.substr(0, dot);
    if (key_section != section && !key_section.empty()) absl::StrAppend(&yaml, key_section, ":\n");
    section = key_section;
    absl::StrAppend(&yaml, section.empty() ? "" : "  ",
                    key.name.substr(dot == std::string::npos ? 0 : dot + 1), ": ", key.show(config), "\n");
  }
  return yaml;
}

std::string ExpandPathPattern(absl::string_view pattern, int rank, unsigned uid) {
  return absl::StrReplaceAll(pattern, {{"{rank}", std::to_string(rank)}, {"{uid}", std::to_string(uid)}});
}

}  // namespace ckptd
