#include "daemon/base/config.h"

#include <yaml-cpp/yaml.h>

#include <functional>
#include <map>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "daemon/base/status.h"

namespace ckptd {

absl::StatusOr<absl::Duration> ParseDuration(absl::string_view text) {
  double seconds = 0;
  if (absl::SimpleAtod(text, &seconds) && seconds > 0) {
    return absl::Seconds(seconds);
  }
  absl::Duration d;
  if (absl::ParseDuration(text, &d) && d > absl::ZeroDuration()) return d;
  return absl::InvalidArgumentError(absl::StrCat("bad duration '", text, "' (want e.g. 30s, 500ms, 2m)"));
}

absl::StatusOr<int64_t> ParseByteRate(absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  absl::ConsumeSuffix(&t, "/s");
  size_t digits = 0;
  while (digits < t.size() && (absl::ascii_isdigit(t[digits]) || t[digits] == '.')) ++digits;
  double number = 0;
  const absl::string_view unit = absl::StripAsciiWhitespace(t.substr(digits));
  static const std::map<std::string, double, std::less<>> kUnits = {
      {"", 1},    {"B", 1},    {"K", 1e3},      {"KB", 1e3},        {"M", 1e6},           {"MB", 1e6},
      {"G", 1e9}, {"GB", 1e9}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  const auto factor = kUnits.find(unit);
  if (digits == 0 || !absl::SimpleAtod(t.substr(0, digits), &number) || factor == kUnits.end() ||
      number * factor->second >= 9e18) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad byte rate '", text, "' (want e.g. 200MB/s, 1GiB/s, or 0 for no limit)"));
  }
  return static_cast<int64_t>(number * factor->second);
}

namespace {

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("config: ", what));
}

// Calls fn(key, value) for each key of the map under `section`. fn answers NOT_FOUND
// for a key it does not know, reported as an unknown key; a typo never falls back to
// a default.
absl::Status ForEachKey(const std::string& section, const YAML::Node& node,
                        const std::function<absl::Status(const std::string&, const YAML::Node&)>& fn) {
  if (!node.IsMap()) return Invalid(absl::StrCat(section, " must be a map"));
  for (const auto& item : node) {
    const std::string key = item.first.as<std::string>();
    const absl::Status s = fn(key, item.second);
    if (absl::IsNotFound(s)) return Invalid(absl::StrCat("unknown key ", section, ".", key));
    RETURN_IF_ERROR(s);
  }
  return absl::OkStatus();
}

// What a key parser answers for a key it does not know.
absl::Status Unknown() { return absl::NotFoundError(""); }

absl::Status ParseSection(const std::string& section, const YAML::Node& node, DaemonConfig& config) {
  if (section == "commit") {
    return ForEachKey(section, node, [&](const std::string& key, const YAML::Node& value) -> absl::Status {
      if (key != "timeout") return Unknown();
      absl::StatusOr<absl::Duration> d = ParseDuration(value.as<std::string>());
      if (!d.ok()) return Invalid(absl::StrCat("commit.timeout: ", d.status().message()));
      config.commit_timeout = *d;
      return absl::OkStatus();
    });
  }
  if (section == "security") {
    return ForEachKey(section, node, [&](const std::string& key, const YAML::Node& value) -> absl::Status {
      if (key == "allowed_uids" || key == "allowed_gids") {
        (key == "allowed_uids" ? config.allowed_uids : config.allowed_gids) =
            value.as<std::vector<uint32_t>>();
      } else if (key == "socket_group" || key == "checkpoint_group") {
        (key == "socket_group" ? config.socket_group : config.checkpoint_group) = value.as<std::string>();
      } else {
        return Unknown();
      }
      return absl::OkStatus();
    });
  }
  if (section == "limits") {
    RETURN_IF_ERROR(
        ForEachKey(section, node, [&](const std::string& key, const YAML::Node& value) -> absl::Status {
          if (key == "max_tensors_per_request" || key == "max_request_bytes") {
            (key == "max_request_bytes" ? config.max_request_bytes : config.max_tensors_per_request) =
                value.as<int64_t>();
          } else if (key == "max_concurrent_rpcs" || key == "max_trainers") {
            (key == "max_trainers" ? config.max_trainers : config.max_concurrent_rpcs) = value.as<int>();
          } else {
            return Unknown();
          }
          return absl::OkStatus();
        }));
    if (config.max_tensors_per_request < 1 || config.max_request_bytes < 1 ||
        config.max_concurrent_rpcs < 4 || config.max_trainers < 1) {
      return Invalid("limits must be positive (max_concurrent_rpcs at least 4)");
    }
    return absl::OkStatus();
  }
  if (section == "staging") {
    return ForEachKey(section, node, [&](const std::string& key, const YAML::Node& value) -> absl::Status {
      if (key != "memory_limit") return Unknown();
      config.staging_memory_limit = value.as<int64_t>();
      return config.staging_memory_limit < 1 ? Invalid("staging.memory_limit must be positive")
                                             : absl::OkStatus();
    });
  }
  if (section == "tcp") {
    return ForEachKey(section, node, [&](const std::string& key, const YAML::Node& value) -> absl::Status {
      std::string* target = key == "address"    ? &config.tcp_address
                            : key == "tls_cert" ? &config.tls_cert
                            : key == "tls_key"  ? &config.tls_key
                            : key == "tls_ca"   ? &config.tls_ca
                                                : nullptr;
      if (target == nullptr) return Unknown();
      *target = value.as<std::string>();
      return absl::OkStatus();
    });
  }
  if (section == "retention") {
    return ForEachKey(section, node, [&](const std::string& key, const YAML::Node& value) -> absl::Status {
      int* target = key == "keep_last"            ? &config.keep_last
                    : key == "keep_every_n_steps" ? &config.keep_every_n_steps
                                                  : nullptr;
      if (target == nullptr) return Unknown();
      *target = value.as<int>();
      return *target < 0 ? Invalid(absl::StrCat("retention.", key, " must be >= 0")) : absl::OkStatus();
    });
  }
  return Unknown();
}

absl::Status ParseTopLevel(const std::string& key, const YAML::Node& value, DaemonConfig& config) {
  if (key == "socket_path" || key == "root" || key == "log_level") {
    (key == "root"        ? config.root
     : key == "log_level" ? config.log_level
                          : config.socket_path) = value.as<std::string>();
  } else if (key == "metrics_address") {
    config.metrics_address = value.as<std::string>();
    const size_t colon = config.metrics_address.rfind(':');
    int port = -1;
    if (config.metrics_address.empty()) return absl::OkStatus();  // off
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(config.metrics_address.substr(colon + 1), &port) || port < 0 || port > 65535) {
      return Invalid(absl::StrCat("metrics_address must be HOST:PORT, not '", config.metrics_address, "'"));
    }
  } else if (key == "log_format") {
    config.log_format = value.as<std::string>();
    if (config.log_format != "text" && config.log_format != "json") {
      return Invalid(absl::StrCat("log_format must be text or json, not '", config.log_format, "'"));
    }
  } else if (key == "storage") {
    absl::StatusOr<Storage> storage = ParseStorage(value.as<std::string>());
    if (!storage.ok()) return Invalid(storage.status().message());
    config.storage = *storage;
  } else if (key == "max_index_bytes") {
    config.max_index_bytes = value.as<int64_t>();
  } else if (key == "replicas") {
    config.replicas = value.as<int>();
    if (config.replicas < 0) return Invalid("replicas must be >= 0");
  } else if (key == "drain_to") {
    config.drain_to = value.as<std::string>();
  } else if (key == "drain_bandwidth") {
    absl::StatusOr<int64_t> rate = ParseByteRate(value.as<std::string>());
    if (!rate.ok()) return Invalid(absl::StrCat("drain_bandwidth: ", rate.status().message()));
    config.drain_bandwidth = *rate;
  } else if (key == "drain_keep_last" || key == "drain_every_n_steps" || key == "memory_steps") {
    int& target = key == "drain_keep_last"       ? config.drain_keep_last
                  : key == "drain_every_n_steps" ? config.drain_every_n_steps
                                                 : config.memory_steps;
    target = value.as<int>();
    if (target < 0) return Invalid(absl::StrCat(key, " must be >= 0"));
  } else if (key == "read_once") {
    config.read_once = value.as<bool>();
  } else if (key == "read_cache") {
    absl::StatusOr<int64_t> bytes = ParseByteRate(value.as<std::string>());
    if (!bytes.ok() || absl::EndsWith(value.as<std::string>(), "/s")) {
      return Invalid(
          absl::StrCat("read_cache: bad size '", value.as<std::string>(), "' (want e.g. 1GiB, 512MB, 0)"));
    }
    config.read_cache_bytes = *bytes;
  } else if (key == "read_cache_linger") {
    absl::StatusOr<absl::Duration> linger = ParseDuration(value.as<std::string>());
    if (!linger.ok()) return Invalid(absl::StrCat("read_cache_linger: ", linger.status().message()));
    config.read_cache_linger = *linger;
  } else if (key == "failure_domains") {
    if (!value.IsMap()) return Invalid("failure_domains must map host names to domain names");
    for (const auto& item : value) {
      config.failure_domains[item.first.as<std::string>()] = item.second.as<std::string>();
    }
  } else {
    const absl::Status s = ParseSection(key, value, config);
    if (absl::IsNotFound(s)) return Invalid(absl::StrCat("unknown key '", key, "'"));
    return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DaemonConfig> ParseConfig(absl::string_view yaml_text) {
  DaemonConfig config;
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
    if (root.IsNull()) return config;
    if (!root.IsMap()) return Invalid("top level must be a map");
    for (const auto& item : root) {
      RETURN_IF_ERROR(ParseTopLevel(item.first.as<std::string>(), item.second, config));
    }
  } catch (const YAML::Exception& e) {
    // yaml-cpp reports a value of the wrong type by exception; parsing stops here.
    return Invalid(e.what());
  }
  if (config.root.empty()) return Invalid("root must not be empty");
  if (!config.tcp_address.empty() &&
      (config.tls_cert.empty() || config.tls_key.empty() || config.tls_ca.empty())) {
    return Invalid(
        "tcp.address needs tcp.tls_cert, tcp.tls_key and tcp.tls_ca: TCP is served only with mutual TLS");
  }
  if (config.socket_path.empty()) return Invalid("socket_path must not be empty");
  RETURN_IF_ERROR(ValidateConfig(config));
  return config;
}

absl::Status ValidateConfig(const DaemonConfig& config) {
  if (config.replicas > 0 && config.storage != Storage::kLocal) {
    return Invalid("replicas: copies go to other hosts' local disks; they need storage: local");
  }
  if (config.replicas > 0 && config.tcp_address.empty()) {
    return Invalid("replicas: hosts copy data files through each other's daemons; they need tcp.address");
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

absl::StatusOr<Storage> ParseStorage(absl::string_view text) {
  if (text == "shared") return Storage::kShared;
  if (text == "local") return Storage::kLocal;
  return absl::InvalidArgumentError(absl::StrCat("storage: '", text, "' is neither 'shared' nor 'local'"));
}

absl::string_view StorageName(Storage storage) { return storage == Storage::kLocal ? "local" : "shared"; }

std::string ExpandPathPattern(absl::string_view pattern, int rank, unsigned uid) {
  return absl::StrReplaceAll(pattern, {{"{rank}", std::to_string(rank)}, {"{uid}", std::to_string(uid)}});
}

}  // namespace ckptd
