#include "daemon/base/config.h"

#include <yaml-cpp/yaml.h>

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

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

absl::StatusOr<DaemonConfig> ParseConfig(absl::string_view yaml_text) {
  DaemonConfig config;
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", e.what()));
  }
  if (root.IsNull()) return config;
  if (!root.IsMap()) return absl::InvalidArgumentError("config: top level must be a map");
  try {
    for (const auto& item : root) {
      const std::string key = item.first.as<std::string>();
      const YAML::Node& value = item.second;
      if (key == "socket_path") {
        config.socket_path = value.as<std::string>();
      } else if (key == "root") {
        config.root = value.as<std::string>();
      } else if (key == "storage") {
        absl::StatusOr<Storage> storage = ParseStorage(value.as<std::string>());
        if (!storage.ok())
          return absl::InvalidArgumentError(absl::StrCat("config: ", storage.status().message()));
        config.storage = *storage;
      } else if (key == "log_level") {
        config.log_level = value.as<std::string>();
      } else if (key == "max_index_bytes") {
        config.max_index_bytes = value.as<int64_t>();
      } else if (key == "commit") {
        if (!value.IsMap()) return absl::InvalidArgumentError("config: commit must be a map");
        for (const auto& sub : value) {
          const std::string subkey = sub.first.as<std::string>();
          if (subkey != "timeout") {
            return absl::InvalidArgumentError(absl::StrCat("config: unknown key commit.", subkey));
          }
          auto d = ParseDuration(sub.second.as<std::string>());
          if (!d.ok())
            return absl::InvalidArgumentError(absl::StrCat("config: commit.timeout: ", d.status().message()));
          config.commit_timeout = *d;
        }
      } else if (key == "security") {
        if (!value.IsMap()) return absl::InvalidArgumentError("config: security must be a map");
        for (const auto& sub : value) {
          const std::string subkey = sub.first.as<std::string>();
          if (subkey == "allowed_uids") {
            config.allowed_uids = sub.second.as<std::vector<uint32_t>>();
          } else if (subkey == "allowed_gids") {
            config.allowed_gids = sub.second.as<std::vector<uint32_t>>();
          } else if (subkey == "socket_group") {
            config.socket_group = sub.second.as<std::string>();
          } else if (subkey == "checkpoint_group") {
            config.checkpoint_group = sub.second.as<std::string>();
          } else {
            return absl::InvalidArgumentError(absl::StrCat("config: unknown key security.", subkey));
          }
        }
      } else if (key == "limits") {
        if (!value.IsMap()) return absl::InvalidArgumentError("config: limits must be a map");
        for (const auto& sub : value) {
          const std::string subkey = sub.first.as<std::string>();
          if (subkey == "max_tensors_per_request") {
            config.max_tensors_per_request = sub.second.as<int64_t>();
          } else if (subkey == "max_request_bytes") {
            config.max_request_bytes = sub.second.as<int64_t>();
          } else if (subkey == "max_concurrent_rpcs") {
            config.max_concurrent_rpcs = sub.second.as<int>();
          } else if (subkey == "max_trainers") {
            config.max_trainers = sub.second.as<int>();
          } else {
            return absl::InvalidArgumentError(absl::StrCat("config: unknown key limits.", subkey));
          }
        }
        if (config.max_tensors_per_request < 1 || config.max_request_bytes < 1 ||
            config.max_concurrent_rpcs < 4 || config.max_trainers < 1) {
          return absl::InvalidArgumentError(
              "config: limits must be positive (max_concurrent_rpcs at least 4)");
        }
      } else if (key == "staging") {
        if (!value.IsMap()) return absl::InvalidArgumentError("config: staging must be a map");
        for (const auto& sub : value) {
          const std::string subkey = sub.first.as<std::string>();
          if (subkey != "memory_limit") {
            return absl::InvalidArgumentError(absl::StrCat("config: unknown key staging.", subkey));
          }
          config.staging_memory_limit = sub.second.as<int64_t>();
          if (config.staging_memory_limit < 1)
            return absl::InvalidArgumentError("config: staging.memory_limit must be positive");
        }
      } else if (key == "tcp") {
        if (!value.IsMap()) return absl::InvalidArgumentError("config: tcp must be a map");
        for (const auto& sub : value) {
          const std::string subkey = sub.first.as<std::string>();
          std::string* target = subkey == "address"    ? &config.tcp_address
                                : subkey == "tls_cert" ? &config.tls_cert
                                : subkey == "tls_key"  ? &config.tls_key
                                : subkey == "tls_ca"   ? &config.tls_ca
                                                       : nullptr;
          if (target == nullptr)
            return absl::InvalidArgumentError(absl::StrCat("config: unknown key tcp.", subkey));
          *target = sub.second.as<std::string>();
        }
      } else if (key == "retention") {
        if (!value.IsMap()) return absl::InvalidArgumentError("config: retention must be a map");
        for (const auto& sub : value) {
          const std::string subkey = sub.first.as<std::string>();
          int* target = subkey == "keep_last"            ? &config.keep_last
                        : subkey == "keep_every_n_steps" ? &config.keep_every_n_steps
                                                         : nullptr;
          if (target == nullptr) {
            return absl::InvalidArgumentError(absl::StrCat("config: unknown key retention.", subkey));
          }
          *target = sub.second.as<int>();
          if (*target < 0)
            return absl::InvalidArgumentError(absl::StrCat("config: retention.", subkey, " must be >= 0"));
        }
      } else {
        return absl::InvalidArgumentError(absl::StrCat("config: unknown key '", key, "'"));
      }
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", e.what()));
  }
  if (config.root.empty()) return absl::InvalidArgumentError("config: root must not be empty");
  if (!config.tcp_address.empty() &&
      (config.tls_cert.empty() || config.tls_key.empty() || config.tls_ca.empty())) {
    return absl::InvalidArgumentError(
        "config: tcp.address needs tcp.tls_cert, tcp.tls_key and tcp.tls_ca: TCP is served only with mutual "
        "TLS");
  }
  if (config.socket_path.empty()) {
    return absl::InvalidArgumentError("config: socket_path must not be empty");
  }
  return config;
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
