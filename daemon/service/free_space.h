// The free bytes of the checkpoint root, for Status and /metrics: read once at
// construction and then by a thread of its own every `every`, so that no caller waits
// on statvfs. The coordinator's rounds carry each rank's status report, so a statvfs
// stuck on a hung network mount would otherwise stall every commit of the job.
// bytes() is thread-safe; the owner constructs and destroys it.
#ifndef CKPTD_DAEMON_SERVICE_FREE_SPACE_H_
#define CKPTD_DAEMON_SERVICE_FREE_SPACE_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/io/file_system.h"

namespace ckptd {

class FreeSpaceMonitor {
 public:
  // `fs` must outlive the monitor.
  FreeSpaceMonitor(FileSystem* fs, std::string path, absl::Duration every = absl::Seconds(1));
  // Stops the thread, after the read in progress if there is one.
  ~FreeSpaceMonitor();
  FreeSpaceMonitor(const FreeSpaceMonitor&) = delete;
  FreeSpaceMonitor& operator=(const FreeSpaceMonitor&) = delete;

  // The last read's answer; -1 when it failed.
  int64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }

 private:
  void Read();
  FileSystem* fs_;
  const std::string path_;
  std::atomic<int64_t> bytes_{-1};
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the rest is ready
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_SERVICE_FREE_SPACE_H_
