// The reader against checkpoints TensorFlow itself wrote (tests/testdata/tf): every
// entry's key, dtype, shape, shard, offset, size and the sha256 of its bytes must
// match expected.json exactly, and every checksum must verify.
#include <gtest/gtest.h>
#include <openssl/sha.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "daemon/base/dtype.h"
#include "daemon/bundle/bundle.h"

namespace ckptd {
namespace {

std::string Sha256Hex(const std::string& data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  std::string out;
  char buf[3];
  for (unsigned char c : digest) {
    std::snprintf(buf, sizeof(buf), "%02x", c);
    out += buf;
  }
  return out;
}

// The prefix in a testdata folder: from its TF `checkpoint` file, else the one *.index.
std::string FindPrefix(const std::string& dir) {
  FileSystem* fs = PosixFileSystem();
  if (fs->Exists(JoinPath(dir, "checkpoint"))) {
    auto text = fs->ReadFileToString(JoinPath(dir, "checkpoint"), 1 << 16);
    auto state = ParseCheckpointState(*text);
    EXPECT_TRUE(state.ok()) << state.status();
    return JoinPath(dir, state->model_checkpoint_path);
  }
  auto names = fs->ListDir(dir);
  if (!names.ok()) return "";
  for (const std::string& name : *names) {
    if (name.size() > 6 && name.substr(name.size() - 6) == ".index")
      return JoinPath(dir, name.substr(0, name.size() - 6));
  }
  return "";
}

class TfTestdataTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TfTestdataTest, MatchesExpectedJson) {
  const std::string dir = JoinPath(CKPTD_TESTDATA_DIR, GetParam());
  FileSystem* fs = PosixFileSystem();
  ASSERT_TRUE(fs->IsDirectory(dir)) << dir << " is missing (tests/testdata/tf is part of the repository)";
  std::ifstream in(JoinPath(dir, "expected.json"));
  const nlohmann::json expected = nlohmann::json::parse(in);
  const std::string prefix = FindPrefix(dir);
  ASSERT_FALSE(prefix.empty());

  auto reader = BundleReader::Open(fs, prefix);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->header().num_shards(), expected["num_shards"].get<int>());
  EXPECT_EQ(static_cast<int>((*reader)->header().endianness()), expected["endianness"].get<int>());

  const auto& entries = (*reader)->entries();
  ASSERT_EQ(entries.size(), expected["entries"].size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& [key, entry] = entries[i];
    const nlohmann::json& want = expected["entries"][i];
    SCOPED_TRACE(key);
    EXPECT_EQ(key, want["key"].get<std::string>());
    EXPECT_EQ(DataTypeName(entry.dtype()), want["dtype"].get<std::string>());
    const auto want_shape = want["shape"].get<std::vector<int64_t>>();
    EXPECT_EQ(ShapeFromProto(entry.shape()), Shape(want_shape.begin(), want_shape.end()));
    EXPECT_EQ(entry.shard_id(), want["shard"].get<int>());
    EXPECT_EQ(entry.offset(), want["offset"].get<int64_t>());
    EXPECT_EQ(entry.size(), want["size"].get<int64_t>());
    EXPECT_EQ(want.contains("slices"), entry.slices_size() > 0);
    std::string bytes(static_cast<size_t>(entry.size()), '\0');
    absl::Status read = (*reader)->ReadEntry(key, entry, bytes.data());
    ASSERT_TRUE(read.ok()) << read;  // also checks the crc32c
    EXPECT_EQ(Sha256Hex(bytes), want["sha256"].get<std::string>());
  }
  EXPECT_TRUE(expected["problems"].empty());
}

INSTANTIATE_TEST_SUITE_P(AllCheckpoints, TfTestdataTest,
                         ::testing::Values("rust_regression-model", "rust_regression_savedmodel",
                                           "rust_keras_single_input_saved_model",
                                           "serving_saved_model_half_plus_two_cpu",
                                           "serving_tf_text_regression", "ocr", "tf1_handwriting"));

// The list above must name every folder, so a checkpoint added to testdata is tested.
TEST(TfTestdataTest, EveryFolderIsListed) {
  auto names = PosixFileSystem()->ListDir(CKPTD_TESTDATA_DIR);
  ASSERT_TRUE(names.ok()) << names.status();
  int folders = 0;
  for (const std::string& n : *names)
    folders += PosixFileSystem()->IsDirectory(JoinPath(CKPTD_TESTDATA_DIR, n));
  EXPECT_EQ(folders, 7);
}

}  // namespace
}  // namespace ckptd
