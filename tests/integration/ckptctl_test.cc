// ckptctl against checkpoints TensorFlow wrote: inspect --json must report exactly what
// expected.json lists, and verify must pass; a flipped byte must make verify exit 1.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "daemon/io/file_system.h"
#include "tests/common/temp_dir.h"
#include "tests/integration/cluster.h"

namespace ckptd::testing {
namespace {

class CkptctlTestdataTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CkptctlTestdataTest, InspectJsonMatchesExpectedAndVerifyPasses) {
  const std::string dir = JoinPath(CKPTD_TESTDATA_DIR, GetParam());
  std::ifstream in(JoinPath(dir, "expected.json"));
  ASSERT_TRUE(in.good()) << dir;
  const nlohmann::json expected = nlohmann::json::parse(in);
  // A folder with a TF `checkpoint` file is passed as the folder; others by prefix.
  std::string target = dir;
  if (!PosixFileSystem()->Exists(JoinPath(dir, "checkpoint"))) target = JoinPath(dir, "variables");

  std::string out;
  ASSERT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " inspect --json ", target), &out), 0) << out;
  const nlohmann::json got = nlohmann::json::parse(out);
  EXPECT_EQ(got["num_shards"], expected["num_shards"]);
  ASSERT_EQ(got["entries"].size(), expected["entries"].size());
  for (size_t i = 0; i < got["entries"].size(); ++i) {
    nlohmann::json want = expected["entries"][i];
    want.erase("sha256");
    EXPECT_EQ(got["entries"][i], want) << i;
  }
  ASSERT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " verify ", target), &out), 0) << out;
  EXPECT_NE(out.find("0 problem(s)"), std::string::npos) << out;
}

INSTANTIATE_TEST_SUITE_P(AllCheckpoints, CkptctlTestdataTest,
                         ::testing::Values("rust_regression-model", "rust_regression_savedmodel",
                                           "rust_keras_single_input_saved_model",
                                           "serving_saved_model_half_plus_two_cpu",
                                           "serving_tf_text_regression", "ocr", "tf1_handwriting"));

TEST(CkptctlTest, VerifyNamesCorruptTensorAndExitsOne) {
  TempDir tmp;
  FileSystem* fs = PosixFileSystem();
  const std::string src = JoinPath(CKPTD_TESTDATA_DIR, "ocr");
  for (const char* name :
       {"variables.index", "variables.data-00000-of-00002", "variables.data-00001-of-00002"}) {
    auto bytes = fs->ReadFileToString(JoinPath(src, name), 1 << 26);
    ASSERT_TRUE(bytes.ok());
    if (name == std::string("variables.data-00001-of-00002")) (*bytes)[401408 + 7] ^= 0x40;  // layer-1/bias
    ASSERT_TRUE(fs->WriteFileAtomically(tmp.Sub(name), *bytes).ok());
  }
  std::string out;
  EXPECT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " verify ", tmp.Sub("variables")), &out), 1) << out;
  EXPECT_NE(out.find("layer-1/bias/.ATTRIBUTES/VARIABLE_VALUE"), std::string::npos) << out;
  EXPECT_NE(out.find("variables.data-00001-of-00002"), std::string::npos) << out;
  EXPECT_NE(out.find("1 problem(s)"), std::string::npos) << out;
}

TEST(CkptctlTest, MissingCheckpointIsUsageErrorNotCrash) {
  std::string out;
  EXPECT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " inspect /nonexistent/prefix"), &out), 2) << out;
  EXPECT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " bogus"), &out), 2) << out;
  EXPECT_NE(out.find("unknown command 'bogus'; one of: ls, inspect"), std::string::npos) << out;
}

}  // namespace
}  // namespace ckptd::testing
