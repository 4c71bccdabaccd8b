#include "daemon/staging/shared_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"

namespace ckptd {

absl::StatusOr<std::shared_ptr<SharedSegment>> SharedSegment::Open(pid_t pid, int fd, int64_t offset,
                                                                   int64_t size, Access access) {
  if (fd < 0 || offset < 0 || size < 0 || size > INT64_MAX - offset) {
    return absl::InvalidArgumentError("shared_memory: fd, offset and size must be non-negative");
  }
  const std::string path = absl::StrCat("/proc/", pid, "/fd/", fd);
  const int flags = (access == Access::kWrite ? O_RDWR : O_RDONLY) | O_CLOEXEC;
  const int opened = ::open(path.c_str(), flags);
  if (opened < 0) return ErrnoToStatus(errno, absl::StrCat("shared_memory: open the trainer's fd ", fd));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{opened};
  struct stat st = {};
  if (::fstat(opened, &st) != 0) return ErrnoToStatus(errno, "shared_memory: fstat");
  const int seals = ::fcntl(opened, F_GET_SEALS);
  if (!S_ISREG(st.st_mode) || seals < 0) {
    return absl::InvalidArgumentError(absl::StrCat("shared_memory: fd ", fd, " is not a memfd"));
  }
  if ((seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared_memory: fd ", fd,
                     " must be sealed with F_SEAL_SHRINK (a segment that can shrink "
                     "under the daemon's mapping is refused)"));
  }
  if (st.st_size < offset + size) {
    return absl::InvalidArgumentError(absl::StrCat("shared_memory: segment holds ", st.st_size,
                                                   " bytes, fewer than ", "offset + size = ", offset + size));
  }
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  const int64_t map_offset = offset / page * page;
  const size_t map_size = static_cast<size_t>(offset - map_offset + size);
  if (map_size == 0) return std::shared_ptr<SharedSegment>(new SharedSegment(nullptr, 0, nullptr, 0));
  // Save maps privately: the daemon may write into staged bytes (casts never do, but
  // nothing it does should reach the trainer's memory).
  // A restore's reply is populated at once: the reads that fill it would otherwise
  // fault it in a page at a time (its pages are the trainer's, so this only maps
  // them, or allocates them where the trainer never touched the segment). A save's
  // mapping is not: that would lengthen the trainer's stall.
  const int share = access == Access::kWrite ? MAP_SHARED | MAP_POPULATE : MAP_PRIVATE;
  void* map = ::mmap(nullptr, map_size, PROT_READ | PROT_WRITE, share, opened, map_offset);
  if (map == MAP_FAILED) return ErrnoToStatus(errno, "shared_memory: mmap");
  char* data = static_cast<char*>(map) + (offset - map_offset);
  return std::shared_ptr<SharedSegment>(new SharedSegment(map, map_size, data, size));
}

SharedSegment::~SharedSegment() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

}  // namespace ckptd
