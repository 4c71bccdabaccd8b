#include "daemon/base/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "daemon/base/status.h"

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

TEST(ConfigTest, ReplicasNeedLocalStorageAndTcp) {
  const std::string tcp = "tcp: {address: 0.0.0.0:0, tls_cert: c, tls_key: k, tls_ca: a}\n";
  auto ok = ParseConfig("storage: local\nreplicas: 2\nfailure_domains: {host0: rack0, host1: rack0}\n" + tcp);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->replicas, 2);
  EXPECT_EQ(ok->failure_domains.at("host1"), "rack0");
  auto shared = ParseConfig("replicas: 1\n" + tcp);
  EXPECT_EQ(shared.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shared.status().message().find("storage: local"), std::string::npos) << shared.status();
  auto no_tcp = ParseConfig("storage: local\nreplicas: 1\n");
  EXPECT_NE(no_tcp.status().message().find("tcp.address"), std::string::npos) << no_tcp.status();
  EXPECT_EQ(ParseConfig("storage: local\nreplicas: -1\n" + tcp).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseConfig("failure_domains: [a, b]\n").status().code(), absl::StatusCode::kInvalidArgument);
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
