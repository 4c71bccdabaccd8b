#include "daemon/staging/shared_segment.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"
#include "daemon/io/direct_io_memory.h"

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
  // A segment in huge pages (the trainer made it with MFD_HUGETLB) is mapped in whole
  // huge pages, and O_DIRECT reads and writes use its memory in place.
  struct statfs fs = {};
  const bool huge = ::fstatfs(opened, &fs) == 0 && fs.f_type == HUGETLBFS_MAGIC;
  const int64_t page = huge ? static_cast<int64_t>(st.st_blksize) : ::sysconf(_SC_PAGESIZE);
  const int64_t map_offset = offset / page * page;
  size_t map_size = static_cast<size_t>(offset - map_offset + size);
  // A hugetlbfs file's size is whole huge pages, so this stays inside it.
  if (huge) map_size = static_cast<size_t>((static_cast<int64_t>(map_size) + page - 1) / page * page);
  if (map_size == 0) {
    return std::shared_ptr<SharedSegment>(new SharedSegment(nullptr, 0, nullptr, 0, st.st_dev, st.st_ino));
  }
  // A restore's reply is populated at once: the reads that fill it would otherwise
  // fault it in a page at a time (its pages are the trainer's, so this only maps
  // them, or allocates them where the trainer never touched the segment). A save's
  // mapping is not: that would lengthen the trainer's stall, and the daemon reads
  // the pages soon after anyway.
  const bool write = access == Access::kWrite;
  void* map = ::mmap(nullptr, map_size, write ? PROT_READ | PROT_WRITE : PROT_READ,
                     write ? MAP_SHARED | MAP_POPULATE : MAP_SHARED, opened, map_offset);
  if (map == MAP_FAILED) return ErrnoToStatus(errno, "shared_memory: mmap");
  char* data = static_cast<char*>(map) + (offset - map_offset);
  if (huge) direct_io_memory::Add(map, map_size);
  auto segment =
      std::shared_ptr<SharedSegment>(new SharedSegment(map, map_size, data, size, st.st_dev, st.st_ino));
  segment->huge_pages_ = huge;
  return segment;
}

std::shared_ptr<SharedSegment> SharedSegment::View(std::shared_ptr<const SharedSegment> whole, int64_t offset,
                                                   int64_t size) {
  std::shared_ptr<SharedSegment> view(
      new SharedSegment(nullptr, 0, whole->data() + offset, size, whole->device(), whole->inode()));
  view->whole_ = std::move(whole);
  return view;
}

SharedSegment::~SharedSegment() {
  if (map_ == nullptr) return;
  if (huge_pages_) direct_io_memory::Remove(map_);  // before another mapping can reuse the addresses
  ::munmap(map_, map_size_);
}

SharedSegmentCache::SharedSegmentCache(int per_process, absl::Duration sweep_period)
    : per_process_(per_process), sweep_period_(sweep_period) {
  sweeper_ = std::thread([this] { SweepUntilStopped(); });
}

SharedSegmentCache::~SharedSegmentCache() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  sweeper_.join();
}

void SharedSegmentCache::SweepUntilStopped() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), sweep_period_)) return;
    }
    DropStale();
  }
}

void SharedSegmentCache::DropStale() {
  // The stat calls run outside the lock; a mapping found stale is dropped by identity.
  std::vector<std::pair<std::string, std::shared_ptr<const SharedSegment>>> kept;
  {
    absl::MutexLock lock(&mu_);
    for (const Entry& e : entries_) kept.emplace_back(absl::StrCat("/proc/", e.pid, "/fd/", e.fd), e.whole);
  }
  std::vector<std::shared_ptr<const SharedSegment>> stale;
  for (const auto& [kept_path, mapping] : kept) {
    struct stat now = {};
    if (::stat(kept_path.c_str(), &now) != 0 || now.st_dev != mapping->device() ||
        now.st_ino != mapping->inode()) {
      stale.push_back(mapping);
    }
  }
  if (stale.empty()) return;
  std::vector<std::shared_ptr<const SharedSegment>> dropped;  // unmapped outside the lock
  absl::MutexLock lock(&mu_);
  std::erase_if(entries_, [&](Entry& e) {
    if (!absl::c_linear_search(stale, e.whole)) return false;
    dropped.push_back(std::move(e.whole));
    return true;
  });
}

absl::StatusOr<std::shared_ptr<SharedSegment>> SharedSegmentCache::Open(pid_t pid, int fd, int64_t offset,
                                                                        int64_t size,
                                                                        SharedSegment::Access access) {
  // What the trainer's fd names now: the permission check Open makes, and the key.
  // Anything unusual (no such fd, bad arguments) goes to Open for its error.
  struct stat st = {};
  const std::string path = absl::StrCat("/proc/", pid, "/fd/", fd);
  if (fd < 0 || offset < 0 || size < 0 || size > INT64_MAX - offset || ::stat(path.c_str(), &st) != 0 ||
      st.st_size < offset + size) {
    return SharedSegment::Open(pid, fd, offset, size, access);
  }
  {
    absl::MutexLock lock(&mu_);
    for (Entry& e : entries_) {
      if (e.pid == pid && e.fd == fd && e.whole->device() == st.st_dev && e.whole->inode() == st.st_ino &&
          e.whole->size() >= offset + size &&
          (e.access == SharedSegment::Access::kWrite || access == SharedSegment::Access::kRead)) {
        e.last_use = ++clock_;
        return SharedSegment::View(e.whole, offset, size);
      }
    }
  }
  ASSIGN_OR_RETURN(std::shared_ptr<SharedSegment> whole, SharedSegment::Open(pid, fd, 0, st.st_size, access));
  DropStale();
  std::vector<std::shared_ptr<const SharedSegment>> dropped;  // unmapped outside the lock
  absl::MutexLock lock(&mu_);
  std::erase_if(entries_, [&](Entry& e) {
    if (e.pid != pid || e.fd != fd) return false;
    dropped.push_back(std::move(e.whole));
    return true;
  });
  entries_.push_back({.pid = pid, .fd = fd, .access = access, .whole = whole, .last_use = ++clock_});
  while (true) {
    int mine = 0;
    auto oldest = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->pid != pid) continue;
      ++mine;
      if (oldest == entries_.end() || it->last_use < oldest->last_use) oldest = it;
    }
    if (mine <= per_process_) break;
    dropped.push_back(std::move(oldest->whole));
    entries_.erase(oldest);
  }
  return SharedSegment::View(std::move(whole), offset, size);
}

int64_t SharedSegmentCache::mapped_bytes() const {
  absl::MutexLock lock(&mu_);
  int64_t bytes = 0;
  for (const Entry& e : entries_) bytes += e.whole->size();
  return bytes;
}

int SharedSegmentCache::count() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(entries_.size());
}

}  // namespace ckptd
