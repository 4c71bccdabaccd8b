// SharedSegment: a trainer's shared-memory segment (a memfd), mapped into the daemon
// so that Save can stage straight from it and Restore can deliver into it without
// streaming bytes over the socket.
//
// The trainer names the segment by its own fd number; the daemon opens it through
// /proc/<pid>/fd/<fd>, where pid comes from the connection's SO_PEERCRED, never from
// the request. The kernel checks that the daemon may open the peer's files. The segment
// must be sealed against shrinking (F_SEAL_SHRINK): a segment that could be truncated
// under the mapping would kill the daemon with SIGBUS. Save maps it read-only, so a
// stray write into staged bytes faults in the daemon instead of reaching the trainer;
// Restore maps it writable. A segment in huge pages (MFD_HUGETLB) is registered with
// DirectIoMemory while mapped, so that the file layer reads into it and writes from
// it in place. A SharedSegment is immutable after Open and may be shared between
// threads.
//
// SharedSegmentCache keeps the mappings of trainer segments for the calls after
// them: trainers pool their segments, and mapping a segment and faulting in its pages
// costs more than reading its bytes (on this project's VM, a save checksummed a freshly
// mapped segment at 1.7 GB/s).
#ifndef CKPTD_DAEMON_STAGING_SHARED_SEGMENT_H_
#define CKPTD_DAEMON_STAGING_SHARED_SEGMENT_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ckptd {

class SharedSegment {
 public:
  enum class Access { kRead, kWrite };

  // Maps bytes [offset, offset + size) of the peer's fd. INVALID_ARGUMENT when the
  // fd is not a memfd sealed against shrinking or is smaller than offset + size;
  // PERMISSION_DENIED or NOT_FOUND (errno's) when it cannot be opened.
  static absl::StatusOr<std::shared_ptr<SharedSegment>> Open(pid_t pid, int fd, int64_t offset, int64_t size,
                                                             Access access);
  // Bytes [offset, offset + size) of `whole`, which they keep mapped.
  static std::shared_ptr<SharedSegment> View(std::shared_ptr<const SharedSegment> whole, int64_t offset,
                                             int64_t size);
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  char* data() const { return data_; }  // the byte at `offset`
  int64_t size() const { return size_; }
  // The file mapped (a memfd's device and inode).
  dev_t device() const { return device_; }
  ino_t inode() const { return inode_; }

 private:
  SharedSegment(void* map, size_t map_size, char* data, int64_t size, dev_t device, ino_t inode)
      : map_(map), map_size_(map_size), data_(data), size_(size), device_(device), inode_(inode) {}

  void* map_;
  size_t map_size_;
  char* data_;
  int64_t size_;
  dev_t device_;
  ino_t inode_;
  bool huge_pages_ = false;                     // a mapping registered with DirectIoMemory (never a View)
  std::shared_ptr<const SharedSegment> whole_;  // for a View: what keeps it mapped
};

// Save's and Restore's mappings of trainer segments, kept between calls.
//
// A mapping is reused only while the trainer's fd still names the same memfd (checked
// on every call through /proc, with the same permission check as Open), and at most
// `per_process` are kept per trainer process, the least recently used going first.
// Kept mappings hold their segments' memory, so they go soon after the trainer lets
// go: a background thread drops, every `sweep_period`, the mappings of processes that
// exited and of fds that were closed or now name another file (the Python client,
// for one, closes a restore's segment as soon as the call returns), and every new
// mapping does the same first. Thread-safe; the destructor stops the thread.
class SharedSegmentCache {
 public:
  explicit SharedSegmentCache(int per_process = 16, absl::Duration sweep_period = absl::Seconds(1));
  ~SharedSegmentCache();
  SharedSegmentCache(const SharedSegmentCache&) = delete;
  SharedSegmentCache& operator=(const SharedSegmentCache&) = delete;

  // As SharedSegment::Open(pid, fd, offset, size, access), with the same errors, from
  // a kept mapping of the whole segment where there is one. A writable mapping serves
  // reads too; a read-only one asked to write is replaced by a writable one.
  absl::StatusOr<std::shared_ptr<SharedSegment>> Open(pid_t pid, int fd, int64_t offset, int64_t size,
                                                      SharedSegment::Access access);
  // Drops the mappings trainers no longer hold (what the background thread does).
  void DropStale();
  int64_t mapped_bytes() const;  // of every kept mapping
  int count() const;             // kept mappings

 private:
  struct Entry {
    pid_t pid;
    int fd;
    SharedSegment::Access access;
    std::shared_ptr<const SharedSegment> whole;
    uint64_t last_use;
  };
  void SweepUntilStopped();

  const int per_process_;
  const absl::Duration sweep_period_;
  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread sweeper_;
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_STAGING_SHARED_SEGMENT_H_
