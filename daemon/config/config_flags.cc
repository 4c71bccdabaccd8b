#include "daemon/config/config_flags.h"

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "daemon/base/status.h"
#include "daemon/config/config_keys.h"

namespace ckptd {

void ConfigFlags::Declare(CLI::App& app) {
  for (const ConfigKey& key : ConfigKeys()) {
    if (key.flag.empty()) continue;
    Given& given = values_[key.name];
    const std::string help =
        absl::StrCat(absl::StrReplaceAll(key.doc, {{"`", ""}}), " [config ", key.name, "; ", key.type, "]");
    given.option = app.add_option(key.flag, given.text, help);
  }
}

absl::Status ConfigFlags::Apply(DaemonConfig& config) const {
  for (const ConfigKey& key : ConfigKeys()) {
    const auto given = values_.find(key.name);
    if (given == values_.end() || given->second.option->count() == 0) continue;
    RETURN_IF_ERROR(key.set(ConfigValue::Scalar(given->second.text), key.flag, config));
  }
  return absl::OkStatus();
}

}  // namespace ckptd
