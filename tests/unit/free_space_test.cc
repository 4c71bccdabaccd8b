#include "daemon/service/free_space.h"

#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"

namespace ckptd {
namespace {

// Answers 1000, then blocks its second statvfs until released and answers 2000, and
// says when the third begins (by then the second's answer is stored).
class SlowFreeBytes final : public FileSystemWrapper {
 public:
  SlowFreeBytes() : FileSystemWrapper(PosixFileSystem()) {}
  absl::StatusOr<uint64_t> FreeBytes(const std::string&) override {
    const int call = ++calls_;
    if (call == 2) {
      second_started.Notify();
      release.WaitForNotification();
      return 2000;
    }
    if (call == 3) third_started.Notify();
    return call == 1 ? 1000 : 2000;
  }
  absl::Notification second_started, release, third_started;

 private:
  std::atomic<int> calls_{0};
};

TEST(FreeSpaceMonitorTest, ReadersNeverWaitForAStatvfsInProgress) {
  SlowFreeBytes fs;
  {
    FreeSpaceMonitor monitor(&fs, "/", absl::Milliseconds(1));
    EXPECT_EQ(monitor.bytes(), 1000);  // read at construction
    fs.second_started.WaitForNotification();
    // The monitor's thread is stuck in statvfs; a reader gets the last answer at once.
    EXPECT_EQ(monitor.bytes(), 1000);
    fs.release.Notify();
    fs.third_started.WaitForNotification();
    EXPECT_EQ(monitor.bytes(), 2000);
  }
}

TEST(FreeSpaceMonitorTest, AFailedReadIsMinusOne) {
  FreeSpaceMonitor monitor(PosixFileSystem(), "/no/such/directory/anywhere");
  EXPECT_EQ(monitor.bytes(), -1);
}

}  // namespace
}  // namespace ckptd
