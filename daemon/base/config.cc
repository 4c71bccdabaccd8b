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
  return absl::InvalidArgumentError(
      absl::StrCat("bad duration '", text, "' (want e.g. 30s, 500ms, 2m)"));
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
          if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("config: commit.timeout: ", d.status().message()));
          config.commit_timeout = *d;
        }
      } else if (key == "retention") {
        if (!value.IsMap()) return absl::InvalidArgumentError("config: retention must be a map");
        for (const auto& sub : value) {
          const std::string subkey = sub.first.as<std::string>();
          int* target = subkey == "keep_last" ? &config.keep_last
                        : subkey == "keep_every_n_steps" ? &config.keep_every_n_steps
                                                         : nullptr;
          if (target == nullptr) {
            return absl::InvalidArgumentError(absl::StrCat("config: unknown key retention.", subkey));
          }
          *target = sub.second.as<int>();
          if (*target < 0) return absl::InvalidArgumentError(absl::StrCat("config: retention.", subkey, " must be >= 0"));
        }
      } else {
        return absl::InvalidArgumentError(absl::StrCat("config: unknown key '", key, "'"));
      }
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", e.what()));
  }
  if (config.root.empty()) return absl::InvalidArgumentError("config: root must not be empty");
  if (config.socket_path.empty()) {
    return absl::InvalidArgumentError("config: socket_path must not be empty");
  }
  return config;
}

std::string ExpandSocketPath(absl::string_view pattern, int rank, unsigned uid) {
  return absl::StrReplaceAll(pattern, {{"{rank}", std::to_string(rank)},
                                       {"{uid}", std::to_string(uid)}});
}

}  // namespace ckptd
