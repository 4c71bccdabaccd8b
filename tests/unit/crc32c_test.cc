#include "daemon/bundle/crc32c.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace ckptd::crc32c {
namespace {

TEST(Crc32cTest, KnownValues) {
  EXPECT_EQ(Value("123456789", 9), 0xe3069283u);
  std::string zeros(32, '\0');
  EXPECT_EQ(Value(zeros.data(), zeros.size()), 0x8a9136aau);
  std::string ones(32, '\xff');
  EXPECT_EQ(Value(ones.data(), ones.size()), 0x62a8ab43u);
}

TEST(Crc32cTest, ExtendEqualsWhole) {
  std::string data = "hello, checkpoint world; a longer string to cross 8-byte words";
  for (size_t cut = 0; cut <= data.size(); ++cut) {
    EXPECT_EQ(Extend(Value(data.data(), cut), data.data() + cut, data.size() - cut),
              Value(data.data(), data.size()));
  }
}

// Long inputs take the three-stream path (blocks of 3 x 8 KiB, then 3 x 256 bytes),
// whose partial CRCs are combined: it must agree with the byte-at-a-time table for
// every length around those block sizes, from any start and any previous CRC. So
// must Extend itself, which is ISA-L's code where the build found it.
TEST(Crc32cTest, InterleavedStreamsAgreeWithTheTableAtEveryBlockBoundary) {
  std::mt19937 random(7);
  std::string data(3 * 8192 * 3 + 3 * 256 * 2 + 64, '\0');
  for (char& c : data) c = static_cast<char>(random());
  for (size_t block : {size_t{256}, size_t{8192}}) {
    for (size_t base : {3 * block, 6 * block, 3 * block + 3 * 256}) {
      for (size_t n = base - 9; n <= base + 9; ++n) {
        for (size_t start : {size_t{0}, size_t{3}}) {
          if (start + n > data.size()) continue;
          const uint32_t previous = static_cast<uint32_t>(n * 2654435761u);
          const uint32_t expected = ExtendPortableForTesting(previous, data.data() + start, n);
          ASSERT_EQ(ExtendWithoutIsaLForTesting(previous, data.data() + start, n), expected)
              << "length " << n << " from byte " << start;
          ASSERT_EQ(Extend(previous, data.data() + start, n), expected)
              << "length " << n << " from byte " << start;
        }
      }
    }
  }
  EXPECT_EQ(Value(data.data(), data.size()), ExtendPortableForTesting(0, data.data(), data.size()));
}

TEST(Crc32cTest, CopyAndExtendCopiesAndChecksumsLikeExtend) {
  std::string data(1 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 2654435761u) >> 13);
  // Across the 256 KiB chunk boundary, from unaligned starts, and empty.
  for (size_t n :
       {size_t{0}, size_t{1}, size_t{4095}, size_t{256 << 10}, size_t{(256 << 10) + 1}, data.size() - 5}) {
    for (size_t start : {size_t{0}, size_t{5}}) {
      if (start + n > data.size()) continue;
      std::string copy(n, 'x');
      const uint32_t previous = static_cast<uint32_t>(n * 40503u);
      EXPECT_EQ(CopyAndExtend(previous, copy.data(), data.data() + start, n),
                Extend(previous, data.data() + start, n))
          << "length " << n << " from byte " << start;
      EXPECT_EQ(copy, data.substr(start, n)) << "length " << n << " from byte " << start;
    }
  }
}

TEST(Crc32cTest, MaskRoundTripAndDiffers) {
  const uint32_t crc = Value("foo", 3);
  EXPECT_NE(Mask(crc), crc);
  EXPECT_NE(Mask(Mask(crc)), crc);
  EXPECT_EQ(Unmask(Mask(crc)), crc);
  EXPECT_EQ(Unmask(Unmask(Mask(Mask(crc)))), crc);
}

}  // namespace
}  // namespace ckptd::crc32c
