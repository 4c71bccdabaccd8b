#include "daemon/config/config_flags.h"

#include <CLI/CLI.hpp>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
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
  std::vector<absl::Status> mistakes;
  for (const ConfigKey& key : ConfigKeys()) {
    const auto given = values_.find(key.name);
    if (given == values_.end() || given->second.option->count() == 0) continue;
    if (absl::Status s = key.set(ConfigValue::Scalar(given->second.text), key.flag, config); !s.ok()) {
      mistakes.push_back(std::move(s));
    }
  }
  return JoinMistakes(mistakes);
}

}  // namespace ckptd
