#include "daemon/config/config_keys.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "daemon/base/closest_word.h"
#include "daemon/base/ipv4_network.h"
#include "daemon/base/units.h"

namespace ckptd {
namespace {

template <typename T>
using Field = T DaemonConfig::*;

// How a value looks in a message: a scalar as given, a sequence or map in flow style.
std::string Describe(const ConfigValue& value) {
  switch (value.kind) {
    case ConfigValue::Kind::kScalar:
      return value.scalar;
    case ConfigValue::Kind::kList:
      return absl::StrCat("[", absl::StrJoin(value.list, ", "), "]");
    case ConfigValue::Kind::kMap:
      return absl::StrCat("{", absl::StrJoin(value.map, ", ", absl::PairFormatter(": ")), "}");
  }
  return "";
}

absl::Status MustBe(absl::string_view shown_as, absl::string_view allowed, const ConfigValue& value) {
  return absl::InvalidArgumentError(
      absl::StrCat("config: ", shown_as, " must be ", allowed, ", not '", Describe(value), "'"));
}

// A parser's own complaint (it names the value and the units it wants).
absl::Status Unparsed(absl::string_view shown_as, const absl::Status& parse) {
  return absl::InvalidArgumentError(absl::StrCat("config: ", shown_as, ": ", parse.message()));
}

// A YAML scalar that ParseConfig reads back as exactly `text`.
std::string Quoted(absl::string_view text) {
  return absl::StrCat("\"", absl::StrReplaceAll(text, {{"\\", "\\\\"}, {"\"", "\\\""}}), "\"");
}

// What a key of type `type` checks beyond parsing: empty when `text` is allowed, else
// what is allowed, in words.
using StringCheck = std::function<std::string(const std::string& text)>;

ConfigKey StringKey(std::string name, std::string flag, std::string doc, Field<std::string> field,
                    StringCheck check = nullptr, std::string type = "text") {
  return {.name = std::move(name),
          .flag = std::move(flag),
          .type = std::move(type),
          .doc = std::move(doc),
          .set = [field, check](const ConfigValue& value, absl::string_view shown_as,
                                DaemonConfig& config) -> absl::Status {
            if (value.kind != ConfigValue::Kind::kScalar) return MustBe(shown_as, "a single value", value);
            if (check != nullptr) {
              if (const std::string allowed = check(value.scalar); !allowed.empty()) {
                return MustBe(shown_as, allowed, value);
              }
            }
            config.*field = value.scalar;
            return absl::OkStatus();
          },
          .show = [field](const DaemonConfig& config) { return Quoted(config.*field); }};
}

StringCheck NonEmpty() {
  return [](const std::string& text) { return text.empty() ? "a non-empty path" : ""; };
}

StringCheck OneOf(std::vector<std::string> allowed, std::string in_words) {
  return [allowed = std::move(allowed), in_words = std::move(in_words)](const std::string& text) {
    return std::find(allowed.begin(), allowed.end(), text) == allowed.end() ? in_words : "";
  };
}

// HOST:PORT with a port of 0-65535, or empty (off).
std::string HostPortOrEmpty(const std::string& text) {
  if (text.empty()) return "";
  const size_t colon = text.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(text.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return "HOST:PORT (a port of 0-65535), or empty for off";
  }
  return "";
}

// An interface name as Linux allows one (1-15 characters, none of '/', ':' or
// whitespace, not "." or ".."), an IPv4 network "A.B.C.D/BITS", or empty.
std::string InterfaceOrNetwork(const std::string& text) {
  const char* what = "an interface name (e.g. ib0) or an IPv4 network (e.g. 10.1.0.0/16), or empty";
  if (text.empty()) return "";
  if (text.find('/') != std::string::npos) return ParseIpv4Network(text).has_value() ? "" : what;
  const bool bad_char = std::any_of(text.begin(), text.end(), [](char c) {
    return c == ':' || absl::ascii_isspace(static_cast<unsigned char>(c));
  });
  return text.size() > 15 || text == "." || text == ".." || bad_char ? what : "";
}

template <typename Int>
ConfigKey IntKey(std::string name, std::string flag, std::string doc, Field<Int> field, Int min) {
  const std::string allowed = absl::StrCat("an integer ", min, " or more");
  return {.name = std::move(name),
          .flag = std::move(flag),
          .type = allowed,
          .doc = std::move(doc),
          .set = [field, min, allowed](const ConfigValue& value, absl::string_view shown_as,
                                       DaemonConfig& config) -> absl::Status {
            Int parsed = 0;
            if (value.kind != ConfigValue::Kind::kScalar ||
                !absl::SimpleAtoi(absl::StripAsciiWhitespace(value.scalar), &parsed) || parsed < min) {
              return MustBe(shown_as, allowed, value);
            }
            config.*field = parsed;
            return absl::OkStatus();
          },
          .show = [field](const DaemonConfig& config) { return absl::StrCat(config.*field); }};
}

// Sizes in bytes, with or without units; at least `min`.
ConfigKey SizeKey(std::string name, std::string flag, std::string doc, Field<int64_t> field, int64_t min) {
  const std::string allowed =
      absl::StrCat("a size of ", FormatByteSize(min), " or more, e.g. 1GiB, 512MB or bytes");
  return {.name = std::move(name),
          .flag = std::move(flag),
          .type = "size (e.g. 16GiB, 512MB, bytes)",
          .doc = std::move(doc),
          .set = [field, min, allowed](const ConfigValue& value, absl::string_view shown_as,
                                       DaemonConfig& config) -> absl::Status {
            if (value.kind != ConfigValue::Kind::kScalar) return MustBe(shown_as, allowed, value);
            absl::StatusOr<int64_t> bytes = ParseByteSize(value.scalar);
            if (!bytes.ok() || *bytes < min) return MustBe(shown_as, allowed, value);
            config.*field = *bytes;
            return absl::OkStatus();
          },
          .show = [field](const DaemonConfig& config) { return FormatByteSize(config.*field); }};
}

ConfigKey RateKey(std::string name, std::string flag, std::string doc, Field<int64_t> field) {
  return {.name = std::move(name),
          .flag = std::move(flag),
          .type = "byte rate (e.g. 200MB/s, 1GiB/s; 0: none)",
          .doc = std::move(doc),
          .set = [field](const ConfigValue& value, absl::string_view shown_as,
                         DaemonConfig& config) -> absl::Status {
            if (value.kind != ConfigValue::Kind::kScalar) return MustBe(shown_as, "a byte rate", value);
            absl::StatusOr<int64_t> rate = ParseByteRate(value.scalar);
            if (!rate.ok()) return Unparsed(shown_as, rate.status());
            config.*field = *rate;
            return absl::OkStatus();
          },
          .show =
              [field](const DaemonConfig& config) {
                return config.*field == 0 ? std::string("0")
                                          : absl::StrCat(FormatByteSize(config.*field), "/s");
              }};
}

ConfigKey DurationKey(std::string name, std::string flag, std::string doc, Field<absl::Duration> field) {
  return {.name = std::move(name),
          .flag = std::move(flag),
          .type = "duration (e.g. 30s, 500ms, 2m)",
          .doc = std::move(doc),
          .set = [field](const ConfigValue& value, absl::string_view shown_as,
                         DaemonConfig& config) -> absl::Status {
            if (value.kind != ConfigValue::Kind::kScalar) return MustBe(shown_as, "a duration", value);
            absl::StatusOr<absl::Duration> duration = ParseDuration(value.scalar);
            if (!duration.ok()) return Unparsed(shown_as, duration.status());
            config.*field = *duration;
            return absl::OkStatus();
          },
          .show = [field](const DaemonConfig& config) { return absl::FormatDuration(config.*field); }};
}

ConfigKey BoolKey(std::string name, std::string flag, std::string doc, Field<bool> field) {
  return {
      .name = std::move(name),
      .flag = std::move(flag),
      .type = "true or false",
      .doc = std::move(doc),
      .set = [field](const ConfigValue& value, absl::string_view shown_as,
                     DaemonConfig& config) -> absl::Status {
        const std::string text = absl::AsciiStrToLower(value.scalar);
        if (value.kind == ConfigValue::Kind::kScalar && (text == "true" || text == "yes" || text == "on")) {
          config.*field = true;
        } else if (value.kind == ConfigValue::Kind::kScalar &&
                   (text == "false" || text == "no" || text == "off")) {
          config.*field = false;
        } else {
          return MustBe(shown_as, "true or false", value);
        }
        return absl::OkStatus();
      },
      .show = [field](const DaemonConfig& config) { return config.*field ? "true" : "false"; }};
}

ConfigKey StorageKey(std::string doc) {
  return {
      .name = "storage",
      .flag = "--storage",
      .type = "shared or local",
      .doc = std::move(doc),
      .set = [](const ConfigValue& value, absl::string_view shown_as, DaemonConfig& config) -> absl::Status {
        absl::StatusOr<Storage> storage = ParseStorage(value.scalar);
        if (value.kind != ConfigValue::Kind::kScalar || !storage.ok()) {
          return absl::InvalidArgumentError(absl::StrCat("config: ", shown_as, ": '", Describe(value),
                                                         "' is neither 'shared' nor 'local'"));
        }
        config.storage = *storage;
        return absl::OkStatus();
      },
      .show = [](const DaemonConfig& config) { return std::string(StorageName(config.storage)); }};
}

ConfigKey IdListKey(std::string name, std::string doc, Field<std::vector<uint32_t>> field) {
  return {.name = std::move(name),
          .flag = "",
          .type = "list of numeric ids",
          .doc = std::move(doc),
          .set = [field](const ConfigValue& value, absl::string_view shown_as,
                         DaemonConfig& config) -> absl::Status {
            if (value.kind != ConfigValue::Kind::kList)
              return MustBe(shown_as, "a list of numeric ids", value);
            std::vector<uint32_t> ids;
            for (const std::string& text : value.list) {
              uint32_t id = 0;
              if (!absl::SimpleAtoi(text, &id)) return MustBe(shown_as, "a list of numeric ids", value);
              ids.push_back(id);
            }
            config.*field = std::move(ids);
            return absl::OkStatus();
          },
          .show =
              [field](const DaemonConfig& config) {
                return absl::StrCat("[", absl::StrJoin(config.*field, ", "), "]");
              }};
}

ConfigKey FailureDomainsKey(std::string doc) {
  return {
      .name = "failure_domains",
      .flag = "",
      .type = "map of host names to domain names",
      .doc = std::move(doc),
      .set = [](const ConfigValue& value, absl::string_view shown_as, DaemonConfig& config) -> absl::Status {
        if (value.kind != ConfigValue::Kind::kMap) {
          return MustBe(shown_as, "a map of host names to domain names", value);
        }
        config.failure_domains.clear();
        for (const auto& [host, domain] : value.map) config.failure_domains[host] = domain;
        return absl::OkStatus();
      },
      .show =
          [](const DaemonConfig& config) {
            std::vector<std::string> items;
            for (const auto& [host, domain] : config.failure_domains) {
              items.push_back(absl::StrCat(Quoted(host), ": ", Quoted(domain)));
            }
            return absl::StrCat("{", absl::StrJoin(items, ", "), "}");
          }};
}

using C = DaemonConfig;

// Where checkpoints go and how the hosts share them.
void AddStorageKeys(std::vector<ConfigKey>& keys) {
  keys.push_back(
      StringKey("socket_path", "--socket",
                "unix socket per daemon; `{rank}`, `{uid}` substituted; its directory is created 0700",
                &C::socket_path, NonEmpty(), "path"));
  keys.push_back(StringKey("root", "--root",
                           "checkpoints go to `<root>/<run>/step-NNNNNNNN/`; `{rank}`, `{uid}` substituted; "
                           "owned by the daemon's user",
                           &C::root, NonEmpty(), "path"));
  keys.push_back(
      StorageKey("`shared`: one root every host sees; `local`: a root per daemon on its own disk (see "
                 "\"Clusters without "
                 "a shared file system\"); checked at start-up"));
  keys.push_back(
      IntKey("replicas", "--replicas",
             "local storage: copies of each host's data file on that many other hosts before a step "
             "commits, through the peer channel",
             &C::replicas, 0));
  keys.push_back(StringKey("redundancy", "--redundancy",
                           "`none`, or `parity`: local storage, and each group of `parity_group` hosts keeps "
                           "Reed-Solomon parity of its data files on its own hosts (exclusive with replicas)",
                           &C::redundancy, OneOf({"none", "parity"}, "none or parity"), "none or parity"));
  keys.push_back(IntKey("parity_group", "--parity-group",
                        "redundancy parity: hosts per group (the last groups take the remainder)",
                        &C::parity_group, 2));
  keys.push_back(IntKey("parity", "--parity",
                        "redundancy parity: hosts per group that may be lost; costs parity / (parity_group - "
                        "parity) of the data in space",
                        &C::parity, 1));
  keys.push_back(
      FailureDomainsKey("host name -> failure domain (rack); copies of one file never share one; unmapped "
                        "hosts are their own"));
}

// The tiers beside the root: memory, the read path, the drain.
void AddTierKeys(std::vector<ConfigKey>& keys) {
  keys.push_back(IntKey("memory_steps", "--memory-steps",
                        "keep this daemon's data files of the last N committed steps in staging memory; "
                        "restores read them from there",
                        &C::memory_steps, 0));
  keys.push_back(
      BoolKey("read_once", "",
              "each data file of a step is read from storage by one daemon, which sends its bytes to "
              "the others over the peer channel (see \"Each byte read once\")",
              &C::read_once));
  keys.push_back(BoolKey("restore_into_trainer_memory", "",
                         "write a local trainer's restores into its own memory (process_vm_writev, where the "
                         "kernel lets the daemon ptrace it) instead of through its shared-memory segment",
                         &C::restore_into_trainer_memory));
  keys.push_back(StringKey("peer_interface", "--peer-interface",
                           "without `tcp.address`: the interface (name, or IPv4 network as CIDR) the "
                           "job's own peer channel listens on; empty: Open MPI's TCP interface, else the "
                           "address of the host's name (see \"The peer channel\")",
                           &C::peer_interface, InterfaceOrNetwork, "interface name, CIDR or empty"));
  keys.push_back(
      SizeKey("read_cache", "",
              "memory for blocks of data files read for restores, shared by the host's restores and "
              "the other daemons' reads; 0 = none",
              &C::read_cache_bytes, 0));
  keys.push_back(DurationKey("read_cache_linger", "", "how long such a block stays after its last use",
                             &C::read_cache_linger));
  keys.push_back(
      StringKey("drain_to", "--drain-to",
                "also copy committed steps, in the background, into this directory (one every host "
                "sees, apart from `root`) as complete TF checkpoints; restores fall back to it; "
                "empty: no drain",
                &C::drain_to, nullptr, "path"));
  keys.push_back(RateKey("drain_bandwidth", "--drain-bandwidth", "per-host drain rate; 0: unthrottled",
                         &C::drain_bandwidth));
  keys.push_back(IntKey("drain_keep_last", "",
                        "the drain's own retention: keep the newest N drained steps (0 = all)",
                        &C::drain_keep_last, 0));
  keys.push_back(IntKey("drain_every_n_steps", "", "drain only steps divisible by N (0 or 1: every step)",
                        &C::drain_every_n_steps, 0));
}

// Commits, logs, metrics, retention.
void AddOperationKeys(std::vector<ConfigKey>& keys) {
  keys.push_back(
      DurationKey("commit.timeout", "--commit-timeout",
                  "deadline of every collective of a commit; a rank that misses it fails the step everywhere",
                  &C::commit_timeout));
  keys.push_back(
      StringKey("log_level", "--log-level",
                "every line carries the rank; info logs each commit and restore with bytes and "
                "seconds, debug adds each trainer's staging and each restored box",
                &C::log_level,
                OneOf({"trace", "debug", "info", "warn", "warning", "error", "err", "critical", "off"},
                      "one of trace, debug, info, warn, error, critical, off"),
                "trace, debug, info, warn, error, critical or off"));
  keys.push_back(
      StringKey("metrics_address", "--metrics-address",
                "Prometheus `/metrics` on HOST:PORT (rank r on PORT + r; port 0: any free port, in "
                "`status --json`); empty: off",
                &C::metrics_address, HostPortOrEmpty, "HOST:PORT or empty"));
  keys.push_back(
      StringKey("log_format", "--log-format",
                "`json`: one object per line, `{\"time\", \"rank\", \"host\", \"level\", \"msg\"}` and, "
                "on a line about a step, `run`, `step`, `trainer`, `bytes`, `seconds`; for log shippers",
                &C::log_format, OneOf({"text", "json"}, "text or json"), "text or json"));
  keys.push_back(StringKey("log_file", "--log-file",
                           "append log lines to this file instead of stderr (`{rank}` in it becomes the "
                           "rank; errors still reach stderr too); SIGHUP reopens it, for logrotate",
                           &C::log_file, nullptr, "path or empty"));
  keys.push_back(
      SizeKey("max_index_bytes", "", "largest `ckpt.index` the reader accepts", &C::max_index_bytes, 1));
  keys.push_back(IntKey("retention.keep_last", "--keep-last", "keep the newest N committed steps (0 = all)",
                        &C::keep_last, 0));
  keys.push_back(IntKey("retention.keep_every_n_steps", "--keep-every-n-steps",
                        "also keep steps divisible by K (0 = none)", &C::keep_every_n_steps, 0));
}

// Who may connect, and what one request may ask for.
void AddSecurityAndLimitKeys(std::vector<ConfigKey>& keys) {
  keys.push_back(IdListKey("security.allowed_uids",
                           "uids that may use the socket (SO_PEERCRED); empty: the daemon's own uid and root",
                           &C::allowed_uids));
  keys.push_back(
      IdListKey("security.allowed_gids", "gids whose members may use the socket", &C::allowed_gids));
  keys.push_back(StringKey("security.socket_group", "",
                           "a group name or number: opens the socket to it (dir 0750, socket 0660)",
                           &C::socket_group, nullptr, "group"));
  keys.push_back(StringKey("security.checkpoint_group", "",
                           "a group that may read checkpoints (dirs 0750, files 0640); without it they are "
                           "0700 / 0600",
                           &C::checkpoint_group, nullptr, "group"));
  keys.push_back(IntKey("limits.max_tensors_per_request", "", "refused before anything is allocated",
                        &C::max_tensors_per_request, int64_t{1}));
  keys.push_back(
      SizeKey("limits.max_request_bytes", "", "declared bytes in one Save", &C::max_request_bytes, 1));
  keys.push_back(IntKey("limits.max_concurrent_rpcs", "", "gRPC handler threads; past it RESOURCE_EXHAUSTED",
                        &C::max_concurrent_rpcs, 4));
  keys.push_back(IntKey("limits.max_trainers", "",
                        "largest `trainer_count` of a Save or Barrier (INVALID_ARGUMENT past it)",
                        &C::max_trainers, 1));
  keys.push_back(SizeKey("staging.memory_limit", "",
                         "host memory for staged bytes; a Save waits (to its deadline) for room",
                         &C::staging_memory_limit, 1));
  keys.push_back(StringKey("tcp.address", "",
                           "optional TCP listener, mutual TLS only (needs the three below); empty: none",
                           &C::tcp_address, nullptr, "HOST:PORT or empty"));
  keys.push_back(
      StringKey("tcp.tls_cert", "", "the server's certificate (PEM)", &C::tls_cert, nullptr, "path"));
  keys.push_back(StringKey("tcp.tls_key", "", "its private key (PEM)", &C::tls_key, nullptr, "path"));
  keys.push_back(StringKey("tcp.tls_ca", "", "the CA that client certificates must chain to (PEM)",
                           &C::tls_ca, nullptr, "path"));
}

std::vector<ConfigKey> BuildTable() {
  std::vector<ConfigKey> keys;
  AddStorageKeys(keys);
  AddTierKeys(keys);
  AddOperationKeys(keys);
  AddSecurityAndLimitKeys(keys);
  return keys;
}

}  // namespace

const std::vector<ConfigKey>& ConfigKeys() {
  static const std::vector<ConfigKey>* const keys = new std::vector<ConfigKey>(BuildTable());
  return *keys;
}

const ConfigKey* FindConfigKey(absl::string_view name) {
  for (const ConfigKey& key : ConfigKeys()) {
    if (key.name == name) return &key;
  }
  return nullptr;
}

absl::Status UnknownConfigKey(absl::string_view name) {
  std::vector<std::string> names, leaves;
  for (const ConfigKey& key : ConfigKeys()) {
    names.push_back(key.name);
    leaves.push_back(key.name.substr(key.name.find('.') + 1));
  }
  std::optional<std::string> near = ClosestWord(std::string(name), names);
  if (!near.has_value()) {
    // A key of a section written without it (keep_lats for retention.keep_last), or
    // under the wrong one: the closest key by its last part.
    const std::string leaf(name.substr(name.find('.') + 1));
    if (const std::optional<std::string> near_leaf = ClosestWord(leaf, leaves); near_leaf.has_value()) {
      near = names[std::find(leaves.begin(), leaves.end(), *near_leaf) - leaves.begin()];
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("config: unknown key '", name, "'",
                   near.has_value() ? absl::StrCat(" (did you mean '", *near, "'?)") : ""));
}

absl::Status JoinMistakes(const std::vector<absl::Status>& mistakes) {
  if (mistakes.empty()) return absl::OkStatus();
  if (mistakes.size() == 1) return mistakes[0];
  std::string all = absl::StrCat(mistakes.size(), " mistakes in the config:");
  for (const absl::Status& m : mistakes) absl::StrAppend(&all, "\n  ", m.message());
  return absl::InvalidArgumentError(all);
}

std::string ConfigReferenceMarkdown() {
  const DaemonConfig defaults;
  std::string table = "| key | default | flag | value | meaning |\n|---|---|---|---|---|\n";
  for (const ConfigKey& key : ConfigKeys()) {
    absl::StrAppend(&table, "| `", key.name, "` | `", key.show(defaults), "` | ",
                    key.flag.empty() ? "" : absl::StrCat("`", key.flag, "`"), " | ", key.type, " | ", key.doc,
                    " |\n");
  }
  return table;
}

}  // namespace ckptd
