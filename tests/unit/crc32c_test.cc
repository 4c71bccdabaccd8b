#include "daemon/bundle/crc32c.h"

#include <gtest/gtest.h>

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

TEST(Crc32cTest, MaskRoundTripAndDiffers) {
  const uint32_t crc = Value("foo", 3);
  EXPECT_NE(Mask(crc), crc);
  EXPECT_NE(Mask(Mask(crc)), crc);
  EXPECT_EQ(Unmask(Mask(crc)), crc);
  EXPECT_EQ(Unmask(Unmask(Mask(Mask(crc)))), crc);
}

}  // namespace
}  // namespace ckptd::crc32c
