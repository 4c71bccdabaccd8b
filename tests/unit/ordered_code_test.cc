#include "daemon/bundle/ordered_code.h"

#include <gtest/gtest.h>

namespace ckptd::ordered_code {
namespace {

std::string Hex(const std::string& s) {
  std::string out;
  char buf[4];
  for (unsigned char c : s) {
    std::snprintf(buf, sizeof(buf), "%02x ", c);
    out += buf;
  }
  if (!out.empty()) out.pop_back();
  return out;
}

// TensorFlow's own example (saved_tensor_slice_util_test): "foo" with slice 0,2:-.
TEST(OrderedCodeTest, TensorFlowSliceKeyExample) {
  Box box{{0, 0}, {2, 5}};
  EXPECT_EQ(Hex(EncodeTensorNameSlice("foo", box, {4, 5})), "00 66 6f 6f 00 01 01 02 80 82 80 7f");
}

TEST(OrderedCodeTest, SignedNumbersKnownEncodings) {
  auto enc = [](int64_t v) {
    std::string s;
    WriteSignedNumIncreasing(&s, v);
    return Hex(s);
  };
  EXPECT_EQ(enc(0), "80");
  EXPECT_EQ(enc(-1), "7f");
  EXPECT_EQ(enc(63), "bf");
  EXPECT_EQ(enc(64), "c0 40");
  EXPECT_EQ(enc(-65), "3f bf");
}

TEST(OrderedCodeTest, SignedEncodingPreservesOrder) {
  std::vector<int64_t> values = {
      INT64_MIN, -(int64_t{1} << 40), -100000,  -8193, -8192, -65, -64, -1, 0, 1, 63, 64, 8191, 8192,
      100000,    int64_t{1} << 40,    INT64_MAX};
  std::string prev;
  for (size_t i = 0; i < values.size(); ++i) {
    std::string cur;
    WriteSignedNumIncreasing(&cur, values[i]);
    if (i > 0) {
      EXPECT_LT(prev, cur) << values[i - 1] << " vs " << values[i];
    }
    prev = cur;
  }
}

TEST(OrderedCodeTest, StringEscapesAndNumIncreasing) {
  std::string s;
  WriteString(&s, std::string("a\0b\xff", 4));
  EXPECT_EQ(Hex(s), "61 00 ff 62 ff 00 00 01");
  std::string n;
  WriteNumIncreasing(&n, 0);
  WriteNumIncreasing(&n, 258);
  EXPECT_EQ(Hex(n), "00 02 01 02");
}

}  // namespace
}  // namespace ckptd::ordered_code
