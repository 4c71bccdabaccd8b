#include "daemon/layout/box.h"

#include <gtest/gtest.h>

#include <numeric>

namespace ckptd {
namespace {

TEST(BoxTest, IntersectOverlapping) {
  Box a{{0, 0}, {4, 4}}, b{{2, 3}, {4, 4}};
  auto c = Intersect(a, b);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->start, (Shape{2, 3}));
  EXPECT_EQ(c->length, (Shape{2, 1}));
}

TEST(BoxTest, IntersectTouchingIsEmpty) {
  EXPECT_FALSE(Intersect(Box{{0}, {4}}, Box{{4}, {4}}).has_value());
  EXPECT_FALSE(Intersect(Box{{0}, {0}}, Box{{0}, {4}}).has_value());
}

TEST(BoxTest, TilingExact) {
  EXPECT_TRUE(CheckTiling({Box{{0, 0}, {2, 4}}, Box{{2, 0}, {2, 2}}, Box{{2, 2}, {2, 2}}}, {4, 4}, "t").ok());
}

TEST(BoxTest, TilingGapNamesTensor) {
  absl::Status s = CheckTiling({Box{{0, 0}, {2, 4}}, Box{{2, 0}, {2, 2}}}, {4, 4}, "tensor 'w'");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensor 'w'"), absl::string_view::npos);
  EXPECT_NE(s.message().find("gap"), absl::string_view::npos);
}

TEST(BoxTest, TilingOverlap) {
  absl::Status s = CheckTiling({Box{{0}, {3}}, Box{{2}, {2}}}, {4}, "tensor 'v'");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overlap"), absl::string_view::npos);
}

TEST(BoxTest, ScalarTiling) { EXPECT_TRUE(CheckTiling({Box{}}, {}, "s").ok()); }

TEST(BoxTest, CheckBoxInShape) {
  EXPECT_TRUE(CheckBoxInShape(Box{{1, 0}, {3, 4}}, {4, 4}).ok());
  EXPECT_EQ(CheckBoxInShape(Box{{1, 0}, {4, 4}}, {4, 4}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckBoxInShape(Box{{-1}, {1}}, {4}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckBoxInShape(Box{{0}, {4}}, {4, 4}).code(), absl::StatusCode::kInvalidArgument);
  int64_t n = 0;
  EXPECT_EQ(CheckShape({3, -1}, &n).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckShape({int64_t{1} << 40, int64_t{1} << 40}, &n).code(), absl::StatusCode::kInvalidArgument);
}

TEST(BoxTest, SliceString) {
  EXPECT_EQ((Box{{0, 0}, {2, 5}}).ToSliceString({4, 5}), "0,2:-");
  EXPECT_EQ((Box{{1}, {2}}).ToSliceString({4}), "1,2");
}

// Assembles a 3-D tensor from four boxes and reads back an arbitrary box spanning
// all of them; compares with the element values computed directly.
// Against brute force: every sub-box of a 3x4x5 box at offset (1,2,3); contiguous
// exactly when its elements' row-major indices in the outer box are consecutive.
TEST(BoxTest, ContiguousOffsetMatchesBruteForce) {
  const Box outer{{1, 2, 3}, {3, 4, 5}};
  int contiguous = 0, checked = 0;
  for (int64_t s0 = 0; s0 < 3; ++s0)
    for (int64_t l0 = 1; s0 + l0 <= 3; ++l0)
      for (int64_t s1 = 0; s1 < 4; ++s1)
        for (int64_t l1 = 1; s1 + l1 <= 4; ++l1)
          for (int64_t s2 = 0; s2 < 5; ++s2)
            for (int64_t l2 = 1; s2 + l2 <= 5; ++l2) {
              const Box inner{{1 + s0, 2 + s1, 3 + s2}, {l0, l1, l2}};
              std::vector<int64_t> indices;
              for (int64_t i = s0; i < s0 + l0; ++i)
                for (int64_t j = s1; j < s1 + l1; ++j)
                  for (int64_t k = s2; k < s2 + l2; ++k) indices.push_back((i * 4 + j) * 5 + k);
              const bool consecutive =
                  indices.back() - indices.front() + 1 == static_cast<int64_t>(indices.size());
              std::optional<int64_t> got = ContiguousOffset(inner, outer);
              ASSERT_EQ(got.has_value(), consecutive) << inner.ToString();
              if (got.has_value()) {
                EXPECT_EQ(*got, indices.front()) << inner.ToString();
                ++contiguous;
              }
              ++checked;
            }
  EXPECT_GT(contiguous, 0);
  EXPECT_LT(contiguous, checked);
  // Not inside, or of another rank: never.
  EXPECT_FALSE(ContiguousOffset(Box{{0, 2, 3}, {1, 4, 5}}, outer).has_value());
  EXPECT_FALSE(ContiguousOffset(Box{{1, 2}, {1, 4}}, outer).has_value());
  EXPECT_EQ(ContiguousOffset(Box{{}, {}}, Box{{}, {}}), std::optional<int64_t>(0));
}

TEST(BoxTest, CopyRegionAssemblesAcrossBoxes) {
  const Shape shape{4, 6, 5};
  auto value = [&](int64_t i, int64_t j, int64_t k) { return static_cast<int32_t>(i * 100 + j * 10 + k); };
  auto fill = [&](const Box& b) {
    std::vector<int32_t> out;
    for (int64_t i = 0; i < b.length[0]; ++i)
      for (int64_t j = 0; j < b.length[1]; ++j)
        for (int64_t k = 0; k < b.length[2]; ++k)
          out.push_back(value(b.start[0] + i, b.start[1] + j, b.start[2] + k));
    return out;
  };
  std::vector<Box> pieces = {Box{{0, 0, 0}, {2, 3, 5}}, Box{{0, 3, 0}, {2, 3, 5}}, Box{{2, 0, 0}, {2, 6, 2}},
                             Box{{2, 0, 2}, {2, 6, 3}}};
  ASSERT_TRUE(CheckTiling(pieces, shape, "t").ok());
  const Box want{{1, 2, 1}, {2, 3, 3}};
  std::vector<int32_t> got(static_cast<size_t>(want.NumElements()), -1);
  for (const Box& p : pieces) {
    auto common = Intersect(p, want);
    if (!common) continue;
    std::vector<int32_t> src = fill(p);
    CopyRegion(*common, p, reinterpret_cast<const char*>(src.data()), want,
               reinterpret_cast<char*>(got.data()), 4);
  }
  EXPECT_EQ(got, fill(want));
}

}  // namespace
}  // namespace ckptd
