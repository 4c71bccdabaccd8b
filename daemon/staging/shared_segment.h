// SharedSegment: a trainer's shared-memory segment (a memfd), mapped into the daemon
// so that Save can stage straight from it and Restore can deliver into it without
// streaming bytes over the socket.
//
// The trainer names the segment by its own fd number; the daemon opens it through
// /proc/<pid>/fd/<fd>, where pid comes from the connection's SO_PEERCRED, never from
// the request. The kernel checks that the daemon may open the peer's files. The segment
// must be sealed against shrinking (F_SEAL_SHRINK): a segment that could be truncated
// under the mapping would kill the daemon with SIGBUS. Save maps it privately (copy on
// write), so nothing the daemon does reaches the trainer; Restore maps it shared.
// A SharedSegment is immutable after Open and may be shared between threads.
#ifndef CKPTD_DAEMON_STAGING_SHARED_SEGMENT_H_
#define CKPTD_DAEMON_STAGING_SHARED_SEGMENT_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace ckptd {

class SharedSegment {
 public:
  enum class Access { kRead, kWrite };

  // Maps bytes [offset, offset + size) of the peer's fd. INVALID_ARGUMENT when the
  // fd is not a memfd sealed against shrinking or is smaller than offset + size;
  // PERMISSION_DENIED or NOT_FOUND (errno's) when it cannot be opened.
  static absl::StatusOr<std::shared_ptr<SharedSegment>> Open(pid_t pid, int fd, int64_t offset, int64_t size,
                                                             Access access);
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  char* data() const { return data_; }  // the byte at `offset`
  int64_t size() const { return size_; }

 private:
  SharedSegment(void* map, size_t map_size, char* data, int64_t size)
      : map_(map), map_size_(map_size), data_(data), size_(size) {}

  void* map_;
  size_t map_size_;
  char* data_;
  int64_t size_;
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_STAGING_SHARED_SEGMENT_H_
