// The daemon's configuration keys, each declared once: its YAML name, its command-line
// flag if it has one, what its values may be, its doc line, and how it parses into and
// prints from DaemonConfig. The YAML parse (config.cc), the flag overrides
// (config_flags.cc), `ckptd --check-config` and the configuration reference in
// docs/operations.md (`ckptd --config-reference`) are all made from this table.
// Adding a key is one entry in config_keys.cc, one field in DaemonConfig and its
// paragraph in config/ckptd.yaml (a test checks that the file names every key).
// The table is built once and immutable; any thread.
#ifndef CKPTD_DAEMON_CONFIG_CONFIG_KEYS_H_
#define CKPTD_DAEMON_CONFIG_CONFIG_KEYS_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "daemon/config/config.h"

namespace ckptd {

// One value as the YAML file or the command line gives it: a scalar's text, a
// sequence of scalars, or a map of scalars to scalars.
struct ConfigValue {
  enum class Kind { kScalar, kList, kMap };
  Kind kind = Kind::kScalar;
  std::string scalar;
  std::vector<std::string> list;
  std::vector<std::pair<std::string, std::string>> map;

  static ConfigValue Scalar(std::string text) {
    return {.kind = Kind::kScalar, .scalar = std::move(text), .list = {}, .map = {}};
  }
};

struct ConfigKey {
  std::string name;  // dotted YAML path: "commit.timeout"
  std::string flag;  // "--commit-timeout", or empty: no flag
  std::string type;  // what a value may be, in words: "size (e.g. 1GiB)"
  std::string doc;   // one line of markdown for the reference; flag help strips the `s
  // Parses `value` into `config`, checking what this key alone can check. Errors are
  // INVALID_ARGUMENT "config: <shown_as> ...": the key (or flag) as the user wrote it,
  // the value and what it may be.
  std::function<absl::Status(const ConfigValue& value, absl::string_view shown_as, DaemonConfig& config)> set;
  // The key's value in `config` as a YAML value that `set` reads back.
  std::function<std::string(const DaemonConfig& config)> show;
};

// Every key, in the reference's order; keys of one section are adjacent.
const std::vector<ConfigKey>& ConfigKeys();

// The key of that dotted name, or null.
const ConfigKey* FindConfigKey(absl::string_view name);

// INVALID_ARGUMENT for a key no entry has: "config: unknown key 'a.b'", with the
// closest known key when it is near enough to be a typo.
absl::Status UnknownConfigKey(absl::string_view name);

// OK for none; the one mistake; or INVALID_ARGUMENT "N mistakes in the config:" with
// each on a line of its own, so that one run of the daemon names them all.
absl::Status JoinMistakes(const std::vector<absl::Status>& mistakes);

// The reference table of docs/operations.md: key, default, flag, value, meaning.
std::string ConfigReferenceMarkdown();

}  // namespace ckptd

#endif  // CKPTD_DAEMON_CONFIG_CONFIG_KEYS_H_
