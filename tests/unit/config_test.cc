#include "daemon/config/config.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"
#include "daemon/base/units.h"
#include "daemon/config/config_flags.h"
#include "daemon/config/config_keys.h"

namespace ckptd {
namespace {

TEST(ConfigTest, Defaults) {
  auto c = ParseConfig("");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->commit_timeout, absl::Seconds(60));
  EXPECT_EQ(c->storage, Storage::kShared);
}

TEST(ConfigTest, StorageIsSharedOrLocal) {
  EXPECT_EQ(ParseConfig("storage: local")->storage, Storage::kLocal);
  EXPECT_EQ(ParseConfig("storage: shared")->storage, Storage::kShared);
  const absl::Status s = ParseConfig("storage: nfs").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'nfs' is neither 'shared' nor 'local'"), absl::string_view::npos) << s;
  EXPECT_EQ(ExpandPathPattern("/nvme/ckpt-{rank}", 7, 0), "/nvme/ckpt-7");
}

TEST(ConfigTest, MetricsAddressIsHostPortOrOff) {
  EXPECT_EQ(ParseConfig("")->metrics_address, "");
  EXPECT_EQ(ParseConfig("metrics_address: \"\"")->metrics_address, "");
  EXPECT_EQ(ParseConfig("metrics_address: 0.0.0.0:9464")->metrics_address, "0.0.0.0:9464");
  for (const char* bad :
       {"metrics_address: 9464", "metrics_address: host:port", "metrics_address: h:70000"}) {
    const absl::Status s = ParseConfig(bad).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("metrics_address must be HOST:PORT"), absl::string_view::npos) << s;
  }
}

TEST(ConfigTest, LogFormatIsTextOrJson) {
  EXPECT_EQ(ParseConfig("")->log_format, "text");
  EXPECT_EQ(ParseConfig("log_format: json")->log_format, "json");
  const absl::Status s = ParseConfig("log_format: xml").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("log_format must be text or json, not 'xml'"), absl::string_view::npos) << s;
}

TEST(ConfigTest, ReplicasNeedLocalStorageButNoTcp) {
  const std::string tcp = "tcp: {address: 0.0.0.0:0, tls_cert: c, tls_key: k, tls_ca: a}\n";
  auto ok = ParseConfig("storage: local\nreplicas: 2\nfailure_domains: {host0: rack0, host1: rack0}\n" + tcp);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->replicas, 2);
  EXPECT_EQ(ok->failure_domains.at("host1"), "rack0");
  auto shared = ParseConfig("replicas: 1\n" + tcp);
  EXPECT_EQ(shared.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shared.status().message().find("storage: local"), std::string::npos) << shared.status();
  // Without tcp the daemons make their own peer channel; peer_interface says where.
  auto no_tcp = ParseConfig("storage: local\nreplicas: 1\npeer_interface: 10.1.0.0/16\n");
  ASSERT_TRUE(no_tcp.ok()) << no_tcp.status();
  EXPECT_EQ(no_tcp->peer_interface, "10.1.0.0/16");
  EXPECT_EQ(ParseConfig("storage: local\nreplicas: -1\n" + tcp).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseConfig("failure_domains: [a, b]\n").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConfigTest, ParityNeedsLocalStorageAFittingGroupAndNoReplicas) {
  auto ok = ParseConfig("storage: local\nredundancy: parity\nparity_group: 6\nparity: 2\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->redundancy, "parity");
  EXPECT_EQ(ok->parity_group, 6);
  EXPECT_EQ(ok->parity, 2);
  const std::pair<std::string, std::string> bad[] = {
      {"storage: local\nredundancy: parity\nreplicas: 1\n", "replicas and redundancy: parity are exclusive"},
      {"redundancy: parity\n", "it needs storage: local"},
      {"storage: local\nredundancy: parity\nparity_group: 3\nparity: 3\n", "less than parity_group (3)"},
      {"storage: local\nredundancy: mirror\n", "redundancy must be none or parity"},
      {"storage: local\nparity_group: 1\n", "parity_group must be an integer 2 or more"},
  };
  for (const auto& [text, why] : bad) {
    const absl::Status s = ParseConfig(text).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(s.message().find(why), std::string::npos) << s;
  }
}

TEST(ConfigTest, DrainKeysAndTheirChecks) {
  auto c = ParseConfig(
      "root: /nvme/ckpt\ndrain_to: /lustre/ckpt\ndrain_bandwidth: 200MB/s\ndrain_keep_last: 3\n"
      "drain_every_n_steps: 10\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->drain_to, "/lustre/ckpt");
  EXPECT_EQ(c->drain_bandwidth, 200000000);
  EXPECT_EQ(c->drain_keep_last, 3);
  EXPECT_EQ(c->drain_every_n_steps, 10);
  EXPECT_EQ(*ParseByteRate("1.5GiB/s"), int64_t{1610612736});
  EXPECT_EQ(*ParseByteRate("500M"), 500000000);
  EXPECT_EQ(*ParseByteRate("0"), 0);
  EXPECT_EQ(*ParseByteRate("4096"), 4096);
  for (const char* bad : {"fast", "-5MB/s", "10 parsecs", "", "1e30"}) {
    EXPECT_EQ(ParseByteRate(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  auto inside = ParseConfig("root: /ckpt\ndrain_to: /ckpt/drain\n");
  EXPECT_NE(inside.status().message().find("neither inside the other"), std::string::npos) << inside.status();
  EXPECT_FALSE(ParseConfig("root: /ckpt/local/\ndrain_to: /ckpt\n").ok());
  EXPECT_TRUE(ParseConfig("root: /ckpt-local\ndrain_to: /ckpt\n").ok());
  auto per_rank = ParseConfig("drain_to: /lustre/{rank}\n");
  EXPECT_NE(per_rank.status().message().find("{rank}"), std::string::npos) << per_rank.status();
  EXPECT_EQ(ParseConfig("drain_keep_last: -1\n").status().code(), absl::StatusCode::kInvalidArgument);
  auto rate = ParseConfig("drain_bandwidth: lots\n");
  EXPECT_NE(rate.status().message().find("drain_bandwidth"), std::string::npos) << rate.status();
}

TEST(ConfigTest, ParsesKeys) {
  auto c = ParseConfig(
      "socket_path: /run/x/{rank}.sock\nroot: /data\ncommit:\n  timeout: 1500ms\nlog_level: debug\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->root, "/data");
  EXPECT_EQ(c->commit_timeout, absl::Milliseconds(1500));
  EXPECT_EQ(ExpandPathPattern(c->socket_path, 3, 1000), "/run/x/3.sock");
}

TEST(ConfigTest, UnknownKeyAndBadValuesAreErrors) {
  EXPECT_EQ(ParseConfig("rot: /data").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseConfig("commit:\n  timeout: soon").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseConfig("commit:\n  tmeout: 5s").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseConfig("[1, 2").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseConfig("root: ''").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConfigTest, ExampleConfigParses) {
  std::ifstream in(std::string(CKPTD_SOURCE_DIR) + "/config/ckptd.yaml");
  std::stringstream text;
  text << in.rdbuf();
  ASSERT_FALSE(text.str().empty());
  EXPECT_TRUE(ParseConfig(text.str()).ok());
}

}  // namespace
}  // namespace ckptd

namespace ckptd {
namespace {

TEST(BoundedMessagesTest, ListsAFewIdsThenCountsTheRest) {
  EXPECT_EQ(JoinBounded(std::vector<int>{}), "");
  EXPECT_EQ(JoinBounded(std::vector<std::string>{"1 (on a)", "2 (on b)"}), "1 (on a),2 (on b)");
  EXPECT_EQ(JoinBounded({3, 5, 9}), "3,5,9");
  std::vector<int> many(2047);
  for (int i = 0; i < 2047; ++i) many[i] = i + 1;
  EXPECT_EQ(JoinBounded(many), "1,2,3,4,5,6,7,8 and 2039 more");
  EXPECT_EQ(BoundMessage("short"), "short");
  const std::string cut = BoundMessage(std::string(10000, 'x'));
  EXPECT_LT(cut.size(), kMaxErrorMessageBytes + 64);
  EXPECT_NE(cut.find("(7952 more bytes cut)"), std::string::npos) << cut.substr(kMaxErrorMessageBytes);
}

TEST(ConfigTest, MaxTrainersAndCheckpointGroup) {
  auto config = ParseConfig("limits:\n  max_trainers: 2048\nsecurity:\n  checkpoint_group: ckpt-readers\n");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->max_trainers, 2048);
  EXPECT_EQ(config->checkpoint_group, "ckpt-readers");
  EXPECT_EQ(ParseConfig("limits:\n  max_trainers: 0\n").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckptd

namespace ckptd {
namespace {

std::string ReadSourceFile(const std::string& path) {
  std::ifstream in(std::string(CKPTD_SOURCE_DIR) + "/" + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ConfigTableTest, EffectiveConfigReadsBackToItself) {
  const std::string defaults = EffectiveConfigYaml(DaemonConfig{});
  absl::StatusOr<DaemonConfig> reread = ParseConfig(defaults);
  ASSERT_TRUE(reread.ok()) << reread.status() << "\n" << defaults;
  EXPECT_EQ(EffectiveConfigYaml(*reread), defaults);

  absl::StatusOr<DaemonConfig> changed = ParseConfig(
      "root: '/data/\"quoted\" {rank}'\nstorage: local\nread_once: false\nread_cache: 512MiB\n"
      "read_cache_linger: 1500ms\ndrain_to: /lustre\ndrain_bandwidth: 1.5GiB/s\ncommit:\n  timeout: 90s\n"
      "failure_domains: {a: r1, b: r2}\nsecurity:\n  allowed_uids: [1000, 1001]\nlimits:\n  max_trainers: 7\n"
      "staging:\n  memory_limit: 3000000\n");
  ASSERT_TRUE(changed.ok()) << changed.status();
  const std::string yaml = EffectiveConfigYaml(*changed);
  absl::StatusOr<DaemonConfig> again = ParseConfig(yaml);
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << yaml;
  EXPECT_EQ(EffectiveConfigYaml(*again), yaml);
  EXPECT_EQ(again->root, "/data/\"quoted\" {rank}");
  EXPECT_EQ(again->drain_bandwidth, int64_t{1610612736});
  EXPECT_EQ(again->read_cache_linger, absl::Milliseconds(1500));
  EXPECT_EQ(again->staging_memory_limit, 3000000);
  EXPECT_EQ(again->allowed_uids, (std::vector<uint32_t>{1000, 1001}));
  EXPECT_FALSE(again->read_once);
  EXPECT_NE(yaml.find("limits:\n  max_tensors_per_request: 100000\n"), std::string::npos) << yaml;
}

TEST(ConfigTableTest, SizesTakeTheSameUnitsEverywhere) {
  absl::StatusOr<DaemonConfig> c = ParseConfig(
      "staging:\n  memory_limit: 16GiB\nlimits:\n  max_request_bytes: 2GB\nmax_index_bytes: 64MiB\n"
      "read_cache: 1GiB\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->staging_memory_limit, int64_t{16} << 30);
  EXPECT_EQ(c->max_request_bytes, 2000000000);
  EXPECT_EQ(c->max_index_bytes, int64_t{64} << 20);
  EXPECT_EQ(*ParseByteSize("4096"), 4096);
  EXPECT_FALSE(ParseByteSize("1GiB/s").ok());
  const absl::Status rate_as_size = ParseConfig("read_cache: 1GiB/s").status();
  EXPECT_EQ(rate_as_size.message(),
            "config: read_cache must be a size of 0 or more, e.g. 1GiB, 512MB or bytes, not '1GiB/s'");
}

TEST(ConfigTableTest, EveryMistakeIsNamedInOneRun) {
  EXPECT_EQ(
      ParseConfig("keep_lats: 3\nstaging:\n  memory_limit: lots\nmetrics_address: h:99999\n")
          .status()
          .message(),
      "3 mistakes in the config:\n"
      "  config: unknown key 'keep_lats' (did you mean 'retention.keep_last'?)\n"
      "  config: staging.memory_limit must be a size of 1 or more, e.g. 1GiB, 512MB or bytes, not 'lots'\n"
      "  config: metrics_address must be HOST:PORT (a port of 0-65535), or empty for off, not 'h:99999'");
}

TEST(ConfigTableTest, UnknownKeysNameTheClosestKnownOne) {
  EXPECT_EQ(ParseConfig("retention:\n  keep_lats: 3\n").status().message(),
            "config: unknown key 'retention.keep_lats' (did you mean 'retention.keep_last'?)");
  EXPECT_EQ(ParseConfig("rot: /data").status().message(), "config: unknown key 'rot' (did you mean 'root'?)");
  EXPECT_EQ(ParseConfig("keep_lats: 3").status().message(),
            "config: unknown key 'keep_lats' (did you mean 'retention.keep_last'?)");
  EXPECT_EQ(ParseConfig("limits:\n  memory_limit: 1GiB\n").status().message(),
            "config: unknown key 'limits.memory_limit' (did you mean 'staging.memory_limit'?)");
  EXPECT_EQ(ParseConfig("completely_unrelated: 1").status().message(),
            "config: unknown key 'completely_unrelated'");
  EXPECT_EQ(ParseConfig("limits: 5").status().message(), "config: limits must be a map");
}

// Every key, fed values it cannot take, says INVALID_ARGUMENT naming itself; none
// throws or crashes. A key that takes free text (a path, a group) must still refuse
// a list and a map.
TEST(ConfigTableTest, EveryKeyRefusesBadValuesByName) {
  const std::vector<std::string> bad_values = {
      "abc", "-1", "99999999999999999999999", "1e400", "", "[1, [2]]", "{a: {b: c}}", "[x]", "{a: b}", "0"};
  for (const ConfigKey& key : ConfigKeys()) {
    const size_t dot = key.name.find('.');
    int refused = 0;
    for (const std::string& value : bad_values) {
      const std::string yaml =
          dot == std::string::npos
              ? absl::StrCat(key.name, ": ", value, "\n")
              : absl::StrCat(key.name.substr(0, dot), ":\n  ", key.name.substr(dot + 1), ": ", value, "\n");
      const absl::Status s = ParseConfig(yaml).status();
      if (s.ok()) continue;
      ++refused;
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << yaml;
      EXPECT_NE(s.message().find(key.name), absl::string_view::npos) << yaml << " -> " << s;
    }
    EXPECT_GE(refused, 3) << key.name;
  }
}

TEST(ConfigTableTest, OperationsGuideCarriesTheGeneratedReference) {
  const std::string guide = ReadSourceFile("docs/operations.md");
  EXPECT_NE(guide.find(ConfigReferenceMarkdown()), std::string::npos)
      << "docs/operations.md's configuration reference differs from the table of keys; regenerate it "
         "with `build/ckptd --config-reference`:\n"
      << ConfigReferenceMarkdown();
}

TEST(ConfigTableTest, ExampleConfigDocumentsEveryKey) {
  const std::string example = ReadSourceFile("config/ckptd.yaml");
  for (const ConfigKey& key : ConfigKeys()) {
    const std::string leaf = key.name.substr(key.name.find('.') + 1);
    EXPECT_NE(example.find(absl::StrCat(leaf, ":")), std::string::npos)
        << "config/ckptd.yaml does not mention " << key.name;
  }
}

TEST(ConfigFlagsTest, FlagsOverrideWithTheKeysChecksAndNameTheFlag) {
  auto apply = [](std::vector<std::string> args) -> absl::StatusOr<DaemonConfig> {
    CLI::App app;
    ConfigFlags flags;
    flags.Declare(app);
    std::reverse(args.begin(), args.end());
    app.parse(args);
    DaemonConfig config;
    RETURN_IF_ERROR(flags.Apply(config));
    return config;
  };
  absl::StatusOr<DaemonConfig> c = apply(
      {"--storage", "local", "--keep-last", "3", "--drain-bandwidth", "1GiB/s", "--commit-timeout", "5s"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->storage, Storage::kLocal);
  EXPECT_EQ(c->keep_last, 3);
  EXPECT_EQ(c->drain_bandwidth, int64_t{1} << 30);
  EXPECT_EQ(c->commit_timeout, absl::Seconds(5));
  EXPECT_EQ(apply({"--metrics-address", "127.0.0.1:abc"}).status().message(),
            "config: --metrics-address must be HOST:PORT (a port of 0-65535), or empty for off, not "
            "'127.0.0.1:abc'");
  EXPECT_EQ(apply({"--metrics-address", "127.0.0.1:99999"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(apply({"--keep-last", "-1"}).status().message(),
            "config: --keep-last must be an integer 0 or more, not '-1'");
  EXPECT_EQ(
      apply({"--log-level", "verbose"}).status().message(),
      "config: --log-level must be one of trace, debug, info, warn, error, critical, off, not 'verbose'");
}

}  // namespace
}  // namespace ckptd
