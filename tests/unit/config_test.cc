#include "daemon/base/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace ckptd {
namespace {

TEST(ConfigTest, Defaults) {
  auto c = ParseConfig("");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->commit_timeout, absl::Seconds(60));
}

TEST(ConfigTest, ParsesKeys) {
  auto c = ParseConfig("socket_path: /run/x/{rank}.sock\nroot: /data\ncommit:\n  timeout: 1500ms\nlog_level: debug\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->root, "/data");
  EXPECT_EQ(c->commit_timeout, absl::Milliseconds(1500));
  EXPECT_EQ(ExpandSocketPath(c->socket_path, 3, 1000), "/run/x/3.sock");
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
