// The command-line flags that override config keys: one per key of the table that
// names a flag (config_keys.h), declared on the daemon's CLI11 app and applied over
// the parsed config file with the same parsers and checks as the file's values.
// Main thread only; lives as long as the app that parses into it.
#ifndef CKPTD_DAEMON_CONFIG_CONFIG_FLAGS_H_
#define CKPTD_DAEMON_CONFIG_CONFIG_FLAGS_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "daemon/config/config.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace ckptd {

class ConfigFlags {
 public:
  // Adds a flag to `app` for every key that has one, its help from the key's doc.
  void Declare(CLI::App& app);

  // After the app parsed: sets each key whose flag was given, in table order. Errors
  // are INVALID_ARGUMENT naming the flag, its value and what it may be (every flag's,
  // when several are wrong).
  absl::Status Apply(DaemonConfig& config) const;

 private:
  struct Given {
    CLI::Option* option = nullptr;
    std::string text;
  };
  std::map<std::string, Given> values_;  // by key name
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_CONFIG_CONFIG_FLAGS_H_
