#include "daemon/service/free_space.h"

namespace ckptd {

FreeSpaceMonitor::FreeSpaceMonitor(FileSystem* fs, std::string path, absl::Duration every)
    : fs_(fs), path_(std::move(path)) {
  Read();
  thread_ = std::thread([this, every] {
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&stop_), every)) return;
      }
      Read();
    }
  });
}

FreeSpaceMonitor::~FreeSpaceMonitor() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void FreeSpaceMonitor::Read() {
  const absl::StatusOr<uint64_t> free_bytes = fs_->FreeBytes(path_);
  bytes_.store(free_bytes.ok() ? static_cast<int64_t>(*free_bytes) : -1, std::memory_order_relaxed);
}

}  // namespace ckptd
