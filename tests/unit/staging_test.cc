// StagingArea: the budget, the reuse pool, borrowed memory.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "daemon/staging/staging_area.h"

namespace ckptd {
namespace {

TEST(StagingAreaTest, FreedBufferIsReusedForTheSameSize) {
  StagingArea area(1 << 20);
  char* first = nullptr;
  {
    auto a = area.Allocate(100000);
    ASSERT_TRUE(a.ok()) << a.status();
    first = a->data();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 4096, 0u);
    EXPECT_EQ(area.bytes_staged(), 100000);
  }
  EXPECT_EQ(area.bytes_staged(), 0);
  EXPECT_GT(area.pooled_bytes(), 0);
  auto b = area.Allocate(99000);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->data(), first);
  EXPECT_EQ(area.pooled_bytes(), 0);
}

TEST(StagingAreaTest, PooledMemoryGivesWayToNewAllocations) {
  StagingArea area(1 << 20);
  {
    auto a = area.Allocate(600 << 10);
    ASSERT_TRUE(a.ok());
  }
  EXPECT_EQ(area.pooled_bytes(), 600 << 10);
  // A much smaller request does not take the big buffer, and the pool shrinks so that
  // staged plus pooled stays under the budget.
  auto b = area.Allocate(500 << 10);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(area.pooled_bytes(), 0);
  EXPECT_LE(area.bytes_staged() + area.pooled_bytes(), 1 << 20);
}

TEST(StagingAreaTest, BudgetRefusesWhatCanNeverFitAndTimesOut) {
  StagingArea area(1000);
  EXPECT_EQ(area.Allocate(1001).status().code(), absl::StatusCode::kResourceExhausted);
  auto held = area.Allocate(800);
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(area.Allocate(300, absl::Now() + absl::Milliseconds(1)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(area.peak_bytes_staged(), 800);
}

TEST(StagingAreaTest, BorrowedBytesCountAndKeepTheirOwnerAlive) {
  StagingArea area(1000);
  auto owner = std::make_shared<std::string>(600, 'x');
  std::weak_ptr<std::string> watch = owner;
  {
    auto b = area.Borrow(owner->data(), 600, owner);
    owner.reset();
    ASSERT_TRUE(b.ok());
    EXPECT_TRUE(b->borrowed());
    EXPECT_EQ(area.bytes_staged(), 600);
    EXPECT_FALSE(watch.expired());
    EXPECT_EQ(b->data()[599], 'x');
  }
  EXPECT_TRUE(watch.expired());
  EXPECT_EQ(area.bytes_staged(), 0);
  EXPECT_EQ(area.pooled_bytes(), 0);  // borrowed memory is never pooled
}

}  // namespace
}  // namespace ckptd
