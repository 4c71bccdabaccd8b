// StagingArea: the budget, the reuse pool, borrowed memory. SharedSegmentCache: which
// mappings of trainer segments it reuses and which it lets go.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "daemon/staging/shared_segment.h"
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

// A trainer-style segment in this process: a memfd sealed against shrinking, mapped
// here so the test sees what the daemon's mapping writes.
class TestSegment {
 public:
  explicit TestSegment(size_t size, bool sealed = true) : size_(size) {
    fd_ = ::memfd_create("staging-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(::ftruncate(fd_, static_cast<off_t>(size)), 0);
    if (sealed) {
      EXPECT_EQ(::fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    }
    map_ = static_cast<char*>(::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
    EXPECT_NE(map_, MAP_FAILED);
  }
  ~TestSegment() {
    ::munmap(map_, size_);
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }
  const char* bytes() const { return map_; }
  char* mutable_bytes() { return map_; }  // the trainer writing its next step
  // Moves this segment to fd number `to` (closing whatever was there).
  void MoveTo(int to) {
    ASSERT_EQ(::dup2(fd_, to), to);
    ::close(fd_);
    fd_ = to;
  }
  void Close() {
    ::close(fd_);
    fd_ = -1;
  }

 private:
  size_t size_;
  int fd_ = -1;
  char* map_ = nullptr;
};

TEST(SharedSegmentCacheTest, ASegmentIsMappedOnceAndItsBytesReachTheTrainer) {
  SharedSegmentCache cache;
  TestSegment segment(1 << 20);
  auto first = cache.Open(::getpid(), segment.fd(), 4096, 8192, SharedSegment::Access::kWrite);
  ASSERT_TRUE(first.ok()) << first.status();
  std::memset((*first)->data(), 'a', 8192);
  auto second = cache.Open(::getpid(), segment.fd(), 65536, 100, SharedSegment::Access::kWrite);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->data(), (*first)->data() + (65536 - 4096));  // the same mapping
  EXPECT_EQ((*second)->size(), 100);
  std::memset((*second)->data(), 'b', 100);
  EXPECT_EQ(cache.count(), 1);
  EXPECT_EQ(cache.mapped_bytes(), 1 << 20);
  EXPECT_EQ(segment.bytes()[4096], 'a');
  EXPECT_EQ(segment.bytes()[4096 + 8191], 'a');
  EXPECT_EQ(segment.bytes()[4096 + 8192], '\0');
  EXPECT_EQ(segment.bytes()[65536 + 99], 'b');
}

TEST(SharedSegmentCacheTest, AnFdThatNamesAnotherSegmentIsMappedAfresh) {
  SharedSegmentCache cache;
  TestSegment old_segment(1 << 16);
  const int fd = old_segment.fd();
  ASSERT_TRUE(cache.Open(::getpid(), fd, 0, 10, SharedSegment::Access::kWrite).ok());
  // The trainer's fd number now names a new segment: bytes go there, and the old
  // mapping is let go.
  TestSegment new_segment(1 << 16);
  old_segment.Close();
  new_segment.MoveTo(fd);
  auto mapped = cache.Open(::getpid(), fd, 0, 10, SharedSegment::Access::kWrite);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  std::memset((*mapped)->data(), 'n', 10);
  EXPECT_EQ(new_segment.bytes()[9], 'n');
  EXPECT_EQ(cache.count(), 1);
}

TEST(SharedSegmentCacheTest, KeepsAtMostPerProcessAndLetsClosedSegmentsGo) {
  SharedSegmentCache cache(/*per_process=*/2);
  TestSegment a(1 << 16), b(2 << 16), c(3 << 16);
  ASSERT_TRUE(cache.Open(::getpid(), a.fd(), 0, 1, SharedSegment::Access::kWrite).ok());
  ASSERT_TRUE(cache.Open(::getpid(), b.fd(), 0, 1, SharedSegment::Access::kWrite).ok());
  // a is now the most recent; then b, the least recent, goes for c.
  ASSERT_TRUE(cache.Open(::getpid(), a.fd(), 0, 1, SharedSegment::Access::kWrite).ok());
  ASSERT_TRUE(cache.Open(::getpid(), c.fd(), 0, 1, SharedSegment::Access::kWrite).ok());
  EXPECT_EQ(cache.count(), 2);
  EXPECT_EQ(cache.mapped_bytes(), (1 << 16) + (3 << 16));
  // A segment the trainer closed is not held on its behalf past the next new mapping.
  c.Close();
  ASSERT_TRUE(cache.Open(::getpid(), b.fd(), 0, 1, SharedSegment::Access::kWrite).ok());
  EXPECT_EQ(cache.count(), 2);
  EXPECT_EQ(cache.mapped_bytes(), (1 << 16) + (2 << 16));
}

TEST(SharedSegmentCacheTest, ASegmentTheTrainerClosedIsLetGoWithoutAnotherCall) {
  SharedSegmentCache cache;
  TestSegment kept(1 << 16), closed(2 << 16);
  ASSERT_TRUE(cache.Open(::getpid(), kept.fd(), 0, 1, SharedSegment::Access::kWrite).ok());
  ASSERT_TRUE(cache.Open(::getpid(), closed.fd(), 0, 1, SharedSegment::Access::kWrite).ok());
  closed.Close();     // as the Python client does once a restore returns
  cache.DropStale();  // what the cache's thread does every second
  EXPECT_EQ(cache.count(), 1);
  EXPECT_EQ(cache.mapped_bytes(), 1 << 16);
}

TEST(SharedSegmentCacheTest, RefusesWhatOpenRefusesWithTheSameCodes) {
  SharedSegmentCache cache;
  TestSegment unsealed(4096, /*sealed=*/false), small(4096);
  for (SharedSegment::Access access : {SharedSegment::Access::kRead, SharedSegment::Access::kWrite}) {
    EXPECT_EQ(cache.Open(::getpid(), unsealed.fd(), 0, 1, access).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(cache.Open(::getpid(), small.fd(), 4000, 97, access).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(cache.Open(::getpid(), 999999, 0, 1, access).status().code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(cache.Open(::getpid(), -1, 0, 1, access).status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(cache.count(), 0);
}

// The permissions /proc/self/maps shows for the mapping that holds `p` ("rw-s", ...).
std::string MappingPermissions(const void* p) {
  std::ifstream maps("/proc/self/maps");
  const auto address = reinterpret_cast<uintptr_t>(p);
  std::string line;
  while (std::getline(maps, line)) {
    uintptr_t from = 0, to = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &from, &to, perms) == 3 && from <= address && address < to) {
      return perms;
    }
  }
  return "";
}

TEST(SharedSegmentCacheTest, ASaveReadsThroughOneReadOnlyMappingThatFollowsTheTrainersWrites) {
  SharedSegmentCache cache;
  TestSegment segment(1 << 20);
  std::memset(segment.mutable_bytes(), 's', 1 << 20);
  auto first = cache.Open(::getpid(), segment.fd(), 0, 4096, SharedSegment::Access::kRead);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(MappingPermissions((*first)->data()), "r--s");  // a stray write faults in the daemon
  EXPECT_EQ((*first)->data()[4095], 's');
  // The trainer's next step in the same pooled segment: read through the same mapping.
  std::memset(segment.mutable_bytes(), 't', 1 << 20);
  auto second = cache.Open(::getpid(), segment.fd(), 8192, 100, SharedSegment::Access::kRead);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->data(), (*first)->data() + 8192);
  EXPECT_EQ((*second)->data()[99], 't');
  EXPECT_EQ(cache.count(), 1);
}

TEST(SharedSegmentCacheTest, ARestoreReplacesAReadOnlyMappingAndASaveReusesAWritableOne) {
  SharedSegmentCache cache;
  TestSegment segment(1 << 16);
  auto saved = cache.Open(::getpid(), segment.fd(), 0, 10, SharedSegment::Access::kRead);
  ASSERT_TRUE(saved.ok()) << saved.status();
  auto restored = cache.Open(::getpid(), segment.fd(), 0, 10, SharedSegment::Access::kWrite);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_NE((*restored)->data(), (*saved)->data());
  EXPECT_EQ(MappingPermissions((*restored)->data()), "rw-s");
  std::memset((*restored)->data(), 'r', 10);
  EXPECT_EQ(segment.bytes()[9], 'r');
  EXPECT_EQ((*saved)->data()[9], 'r');  // the save's view stays mapped while it is held
  EXPECT_EQ(cache.count(), 1);
  auto saved_again = cache.Open(::getpid(), segment.fd(), 0, 10, SharedSegment::Access::kRead);
  ASSERT_TRUE(saved_again.ok()) << saved_again.status();
  EXPECT_EQ((*saved_again)->data(), (*restored)->data());
  EXPECT_EQ(cache.count(), 1);
}

}  // namespace
}  // namespace ckptd
