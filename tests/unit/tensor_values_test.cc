// Element decoding, statistics, tolerance comparison, TF string tensors and
// numpy-like printing behind `ckptctl inspect --values/--stats` and `diff --atol`.
#include "client/tensor_values.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "daemon/base/dtype.h"
#include "daemon/bundle/bundle.h"
#include "daemon/layout/cast.h"

namespace ckptd {
namespace {

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

TEST(TensorValuesTest, ElementsOfEveryRealDtypeReadAsDoubles) {
  std::vector<double> out;
  ASSERT_TRUE(ElementsAsDouble(kInt8, Bytes<int8_t>({-128, 127}).data(), 2, &out).ok());
  ASSERT_TRUE(ElementsAsDouble(kUint64, Bytes<uint64_t>({1ull << 40}).data(), 1, &out).ok());
  ASSERT_TRUE(ElementsAsDouble(kBool, Bytes<uint8_t>({1, 0}).data(), 2, &out).ok());
  ASSERT_TRUE(ElementsAsDouble(kBfloat16, Bytes<uint16_t>({FloatToBfloat16(-2.5f)}).data(), 1, &out).ok());
  ASSERT_TRUE(ElementsAsDouble(kHalf, Bytes<uint16_t>({FloatToHalf(0.5f)}).data(), 1, &out).ok());
  ASSERT_TRUE(ElementsAsDouble(kDouble, Bytes<double>({1e300}).data(), 1, &out).ok());
  EXPECT_EQ(out, (std::vector<double>{-128, 127, 1099511627776.0, 1, 0, -2.5, 0.5, 1e300}));
  EXPECT_EQ(ElementsAsDouble(kString, "", 0, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ElementsAsDouble(kComplex64, "", 0, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(IsRealNumeric(kString));
  EXPECT_TRUE(IsRealNumeric(kBool));
}

TEST(TensorValuesTest, StatisticsCountNonFiniteValuesApartFromMinMaxMean) {
  const double inf = std::numeric_limits<double>::infinity();
  TensorStats stats;
  stats.Add({3, std::nan(""), -inf});
  stats.Add({-1, inf, 1});
  EXPECT_EQ(stats.count, 6);
  EXPECT_EQ(stats.finite, 3);
  EXPECT_EQ(stats.nan, 1);
  EXPECT_EQ(stats.pos_inf, 1);
  EXPECT_EQ(stats.neg_inf, 1);
  EXPECT_EQ(stats.min, -1);
  EXPECT_EQ(stats.max, 3);
  EXPECT_DOUBLE_EQ(stats.mean(), 1);
  TensorStats none;
  none.Add({std::nan("")});
  EXPECT_EQ(none.finite, 0);
  EXPECT_EQ(none.mean(), 0);
}

TEST(TensorValuesTest, ToleranceFollowsNumpyIscloseWithEqualNan) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(IsClose(1.0, 1.0, 0, 0));
  EXPECT_FALSE(IsClose(1.0, 1.0 + 1e-9, 0, 0));
  EXPECT_TRUE(IsClose(1.0, 1.1, 0.1 + 1e-12, 0));
  EXPECT_TRUE(IsClose(100, 101, 0, 0.01));  // relative to b
  EXPECT_FALSE(IsClose(101, 100, 0, 0.0099));
  EXPECT_TRUE(IsClose(std::nan(""), std::nan(""), 0, 0));
  EXPECT_FALSE(IsClose(std::nan(""), 0, 1e9, 1e9));
  EXPECT_TRUE(IsClose(inf, inf, 0, 0));
  EXPECT_FALSE(IsClose(inf, -inf, 1e9, 1e9));
  EXPECT_FALSE(IsClose(inf, 1e308, 1e9, 1e9));

  ValueDiff diff;
  diff.Add({1, 2, 3}, {1, 2.5, 3}, 0, 0);
  diff.Add({4, 5}, {4, 7}, 0, 0);
  EXPECT_EQ(diff.compared, 5);
  EXPECT_EQ(diff.mismatched, 2);
  EXPECT_EQ(diff.first_index, 1);
  EXPECT_EQ(diff.max_abs_diff, 2);
}

// The extremes of every integer dtype, read, summed, compared and printed exactly:
// no value passes through a double.
TEST(TensorValuesTest, IntegersOfEveryDtypeStayExactAtTheirExtremes) {
  Numbers n;
  ASSERT_TRUE(
      AppendNumbers(kInt64, Bytes<int64_t>({(int64_t{1} << 53) + 1, (int64_t{1} << 62) + 7}).data(), 2, &n)
          .ok());
  EXPECT_TRUE(n.integral);
  EXPECT_EQ(FormatNumberAt(kInt64, n, 0), "9007199254740993");
  EXPECT_EQ(FormatNumberAt(kInt64, n, 1), "4611686018427387911");
  const auto check_extremes = [](int dtype, const std::string& bytes, const std::string& min,
                                 const std::string& max) {
    Numbers values;
    ASSERT_TRUE(AppendNumbers(dtype, bytes.data(), 2, &values).ok()) << DataTypeName(dtype);
    EXPECT_EQ(FormatNumberAt(dtype, values, 0), min) << DataTypeName(dtype);
    EXPECT_EQ(FormatNumberAt(dtype, values, 1), max) << DataTypeName(dtype);
    TensorStats stats;
    stats.Add(values);
    EXPECT_EQ(FormatInteger(dtype, stats.integer_min), min) << DataTypeName(dtype);
    EXPECT_EQ(FormatInteger(dtype, stats.integer_max), max) << DataTypeName(dtype);
  };
  check_extremes(kInt8, Bytes<int8_t>({-128, 127}), "-128", "127");
  check_extremes(kInt16, Bytes<int16_t>({-32768, 32767}), "-32768", "32767");
  check_extremes(kInt32, Bytes<int32_t>({std::numeric_limits<int32_t>::min(), 2147483647}), "-2147483648",
                 "2147483647");
  check_extremes(kInt64,
                 Bytes<int64_t>({std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()}),
                 "-9223372036854775808", "9223372036854775807");
  check_extremes(kUint8, Bytes<uint8_t>({0, 255}), "0", "255");
  check_extremes(kUint16, Bytes<uint16_t>({0, 65535}), "0", "65535");
  check_extremes(kUint32, Bytes<uint32_t>({0, 4294967295u}), "0", "4294967295");
  check_extremes(kUint64, Bytes<uint64_t>({0, std::numeric_limits<uint64_t>::max()}), "0",
                 "18446744073709551615");
  check_extremes(kBool, Bytes<uint8_t>({0, 1}), "False", "True");

  // Means: exact when they are (to 6 decimals), else rounded and saying so.
  TensorStats big;
  big.Add(n);
  EXPECT_EQ(big.MeanText(), "2310346608841064452");  // (2^53 + 1 + 2^62 + 7) / 2
  EXPECT_FALSE(big.mean_rounded());
  Numbers unsigned_max;
  ASSERT_TRUE(
      AppendNumbers(kUint64, Bytes<uint64_t>({std::numeric_limits<uint64_t>::max()}).data(), 1, &unsigned_max)
          .ok());
  TensorStats one;
  one.Add(unsigned_max);
  EXPECT_EQ(one.MeanText(), "18446744073709551615");
  Numbers thirds;
  ASSERT_TRUE(AppendNumbers(kInt32, Bytes<int32_t>({-1, -1, 0}).data(), 3, &thirds).ok());
  TensorStats third;
  third.Add(thirds);
  EXPECT_EQ(third.MeanText(), "~-0.666667");
  EXPECT_TRUE(third.mean_rounded());
  EXPECT_DOUBLE_EQ(third.mean(), -2.0 / 3);

  // Differences: one unit at 2^53 + 1 is a difference, and an atol is an exact bound.
  Numbers a, b;
  ASSERT_TRUE(AppendNumbers(kInt64, Bytes<int64_t>({(int64_t{1} << 53) + 1, 5}).data(), 2, &a).ok());
  ASSERT_TRUE(AppendNumbers(kInt64, Bytes<int64_t>({int64_t{1} << 53, 5}).data(), 2, &b).ok());
  ValueDiff exact;
  exact.Add(a, b, 0, 0);
  EXPECT_EQ(exact.mismatched, 1);
  EXPECT_EQ(exact.first_index, 0);
  EXPECT_EQ(exact.MaxAbsDiffText(), "1");
  ValueDiff within;
  within.Add(a, b, 1, 0);
  EXPECT_EQ(within.mismatched, 0);
  Numbers lowest, highest;
  ASSERT_TRUE(AppendNumbers(kUint64, Bytes<uint64_t>({0}).data(), 1, &lowest).ok());
  ASSERT_TRUE(
      AppendNumbers(kUint64, Bytes<uint64_t>({std::numeric_limits<uint64_t>::max()}).data(), 1, &highest)
          .ok());
  ValueDiff widest;
  widest.Add(lowest, highest, 2e19, 0);
  EXPECT_EQ(widest.mismatched, 0);
  EXPECT_EQ(widest.MaxAbsDiffText(), "18446744073709551615");
  ValueDiff just_outside;
  just_outside.Add(lowest, highest, 18446744073709549568.0, 0);  // the double just below 2^64 - 1
  EXPECT_EQ(just_outside.mismatched, 1);
}

TEST(TensorValuesTest, StringTensorsDecodeFromTheBundleEncoding) {
  auto scalar = DecodeStrings(EncodeStringScalar("hello"), 1);
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ(*scalar, std::vector<std::string>{"hello"});
  // Three elements: lengths 0, 2, 1, four checksum bytes, then "ab" "c".
  const std::string three = std::string("\x00\x02\x01", 3) + "CRC!" + "abc";
  auto decoded = DecodeStrings(three, 3);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, (std::vector<std::string>{"", "ab", "c"}));
  EXPECT_EQ(DecodeStrings(three.substr(0, 8), 3).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeStrings(three + "x", 3).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeStrings("\xff\xff", 1).status().code(), absl::StatusCode::kDataLoss);
}

TEST(TensorValuesTest, NumbersAndBytesPrintAsPythonPrintsThem) {
  EXPECT_EQ(FormatNumber(kFloat, 0.1f), "0.1");
  EXPECT_EQ(FormatNumber(kDouble, 0.1), "0.1");
  EXPECT_EQ(FormatNumber(kFloat, 2), "2.0");
  EXPECT_EQ(FormatNumber(kFloat, 1e-5f), "1e-05");
  EXPECT_EQ(FormatNumber(kFloat, std::nan("")), "nan");
  EXPECT_EQ(FormatNumber(kHalf, -std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(FormatNumber(kInt64, -7), "-7");
  EXPECT_EQ(FormatNumber(kBool, 1), "True");
  EXPECT_EQ(FormatBytes(std::string("a'\\\n\x00\xff", 6)), "b'a\\'\\\\\\n\\x00\\xff'");
}

TEST(TensorValuesTest, NestedPrintingSummarizesLongDimensionsAsNumpyDoes) {
  EXPECT_EQ(FormatNested({}, {"5"}, false), "5");
  EXPECT_EQ(FormatNested({2, 2}, {"1", "2", "3", "4"}, false), "[[1, 2],\n [3, 4]]");
  EXPECT_EQ(FormatNested({1, 2, 1}, {"1", "2"}, false), "[[[1],\n  [2]]]");
  EXPECT_EQ(SummaryIndices(4), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(SummaryIndices(10), (std::vector<int64_t>{0, 1, 2, 7, 8, 9}));
  std::vector<std::string> shown;
  for (int64_t i : SummaryIndices(10)) shown.push_back(std::to_string(i));
  EXPECT_EQ(FormatNested({10}, shown, true), "[0, 1, 2, ..., 7, 8, 9]");
  EXPECT_EQ(FormatNested({2, 2}, {"1", "2", "3", "4"}, true), "[[1, 2],\n [3, 4]]");
}

}  // namespace
}  // namespace ckptd
