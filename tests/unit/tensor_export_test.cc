// .npy and safetensors writers: headers byte for byte, and file names that cannot
// escape the output directory.
#include "client/tensor_export.h"

#include <gtest/gtest.h>

#include "daemon/base/dtype.h"
#include "tests/common/temp_dir.h"

namespace ckptd {
namespace {

TEST(NpyHeaderTest, MatchesNumpyFormatOne) {
  auto h = NpyHeader(kFloat, {3});
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->size() % 64, 0u);  // data starts aligned
  EXPECT_EQ(h->substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t dict_len = static_cast<unsigned char>((*h)[8]) | static_cast<unsigned char>((*h)[9]) << 8;
  EXPECT_EQ(dict_len + 10, h->size());
  EXPECT_EQ(h->substr(10).find("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }"), 0u);
  EXPECT_EQ(h->back(), '\n');
  EXPECT_NE(NpyHeader(kInt64, {2, 5})->find("'shape': (2, 5)"), std::string::npos);
  EXPECT_NE(NpyHeader(kBool, {})->find("'descr': '|b1', 'fortran_order': False, 'shape': ()"),
            std::string::npos);
  EXPECT_EQ(NpyHeader(kBfloat16, {2}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NpyHeader(kString, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorFileNameTest, NoNameLeadsOutside) {
  EXPECT_EQ(TensorFileName("layer1/kernel"), "layer1/kernel");
  EXPECT_EQ(TensorFileName("../../etc/passwd"), "%2E%2E/%2E%2E/etc/passwd");
  EXPECT_EQ(TensorFileName("/abs"), "%/abs");
  EXPECT_EQ(TensorFileName("a//b"), "a/%/b");
  EXPECT_EQ(TensorFileName("."), "%2E");
  EXPECT_EQ(TensorFileName("w:0 x"), "w%3A0%20x");
  EXPECT_EQ(TensorFileName(".hidden/v..1"), ".hidden/v..1");
}

TEST(SafetensorsTest, HeaderIsAlignedAndOffsetsAreContiguous) {
  testing::TempDir dir;
  const std::string path = dir.Sub("m.safetensors");
  std::vector<ExportTensor> tensors = {{"a", kFloat, {2}}, {"b", kInt8, {3}}};
  const std::vector<std::string> bytes = {std::string(8, 'a'), std::string(3, 'b')};
  ASSERT_TRUE(
      WriteSafetensors(PosixFileSystem(), path, tensors, {{"step", "7"}}, [&](size_t i, std::string* out) {
        *out = bytes[i];
        return absl::OkStatus();
      }).ok());
  auto blob = PosixFileSystem()->ReadFileToString(path, 1 << 20);
  ASSERT_TRUE(blob.ok());
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>((*blob)[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  const std::string header = blob->substr(8, n);
  EXPECT_EQ(
      header.find(R"({"__metadata__":{"step":"7"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"I8","shape":[3],"data_offsets":[8,11]}})"),
      0u)
      << header;
  EXPECT_EQ(blob->substr(8 + n), "aaaaaaaabbb");
  // A reader that delivers the wrong byte count fails the export.
  EXPECT_FALSE(WriteSafetensors(PosixFileSystem(), path, tensors, {}, [&](size_t, std::string* out) {
                 *out = "x";
                 return absl::OkStatus();
               }).ok());
}

}  // namespace
}  // namespace ckptd
