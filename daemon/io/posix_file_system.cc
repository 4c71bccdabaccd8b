#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#ifdef CKPTD_HAVE_LIBURING
#include <liburing.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"
#include "daemon/io/direct_io_memory.h"
#include "daemon/io/file_system.h"

namespace ckptd {
namespace {

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  absl::Status Append(absl::string_view data) override {
    while (!data.empty()) {
      ssize_t n = ::write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoToStatus(errno, absl::StrCat("write ", path_));
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (::fdatasync(fd_) != 0) return ErrnoToStatus(errno, absl::StrCat("fsync ", path_));
    return absl::OkStatus();
  }

  absl::Status Close() override {
    int fd = fd_;
    fd_ = -1;
    if (fd >= 0 && ::close(fd) != 0) return ErrnoToStatus(errno, absl::StrCat("close ", path_));
    return absl::OkStatus();
  }

 private:
  std::string path_;
  int fd_;
};

// Memory that queued O_DIRECT writes and reads are copied through: kSlots slots of kSlotBytes,
// 2 MiB-aligned and advised into transparent huge pages. Why copy: the kernel builds a
// direct write's requests from the physical pages behind the source, and a request
// holds at most max_segments (254 on virtio-blk) runs of contiguous pages. A trainer's
// shared-memory segment is made of 4 KiB pages in no useful physical order (measured
// here from /proc/PID/pagemap: every page a run of its own, in descending order), so a
// 4 MiB write from it left as 1 MiB bios, each split into a 1016 KiB and an 8 KiB
// request: 512 KiB per request on average, and the disk took 2-3 s for 2 GiB that
// it takes 0.5-0.7 s for in 4 MiB requests. Reads into such memory fare the same
// (1.4 GB/s against 3.6-4.0 GB/s through slots, 2 GiB cold). Copying at memcpy speed
// into huge pages costs far less. Regions are pooled because first touch of fresh
// memory is slow. Memory that is itself in huge pages (DirectIoMemory) skips them.
// Thread-safe.
class BounceRegions {
 public:
  static constexpr size_t kSlots = 16;
  static constexpr size_t kSlotBytes = 4 << 20;
  static constexpr size_t kBytes = kSlots * kSlotBytes;

  // A region, or null where no memory is left (writes then go from the source).
  static char* Take() {
    {
      std::lock_guard<std::mutex> lock(mu());
      if (!idle().empty()) {
        char* region = idle().back();
        idle().pop_back();
        return region;
      }
    }
    void* region = nullptr;
    if (posix_memalign(&region, 2 << 20, kBytes) != 0) return nullptr;
    ::madvise(region, kBytes, MADV_HUGEPAGE);  // advice only: 4 KiB pages still work
    return static_cast<char*>(region);
  }

  // Keeps up to kIdle regions for the next reader or writer; frees the rest.
  static void Give(char* region) {
    if (region == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(mu());
      if (idle().size() < kIdle) {
        idle().push_back(region);
        return;
      }
    }
    std::free(region);
  }

 private:
  static constexpr size_t kIdle = 4;  // a restore reads with several threads
  static std::mutex& mu() {
    static std::mutex* m = new std::mutex;
    return *m;
  }
  static std::vector<char*>& idle() {
    static std::vector<char*>* v = new std::vector<char*>;
    return *v;
  }
};

#ifdef CKPTD_HAVE_LIBURING
// Submits what is queued on `ring` and reaps one completion: its slot (the entry's
// user data) and result. Returns 0, or the errno of a ring that failed; then nothing
// more can be reaped the usual way, so it has waited out everything in flight (the
// only way left) and returned those slots to free_slots: the caller may reuse their
// memory.
int ReapOne(io_uring* ring, unsigned depth, std::vector<unsigned>& free_slots, unsigned* slot, int* res) {
  while (true) {
    io_uring_cqe* cqe = nullptr;
    int waited = io_uring_submit_and_wait(ring, 1);
    if (waited >= 0) waited = io_uring_peek_cqe(ring, &cqe);
    if (waited == -EINTR || waited == -EAGAIN) continue;
    if (waited < 0) {
      while (free_slots.size() < depth && io_uring_wait_cqe(ring, &cqe) == 0) {
        free_slots.push_back(static_cast<unsigned>(io_uring_cqe_get_data64(cqe)));
        io_uring_cqe_seen(ring, cqe);
      }
      return -waited;
    }
    *slot = static_cast<unsigned>(io_uring_cqe_get_data64(cqe));
    *res = cqe->res;
    io_uring_cqe_seen(ring, cqe);
    return 0;
  }
}
#endif

// Keeps several O_DIRECT writes of one large range in flight through io_uring. A disk
// reaches its ceiling only with requests queued: one pwrite at a time leaves it idle
// between requests (measured here by scripts/bench_ceiling.py: psync at queue depth 1
// writes about half of what libaio or io_uring at depth 16 do). Each chunk is copied
// into its slot of a BounceRegions region first (see there why), and goes from the
// source where no region could be had or the source is in huge pages (DirectIoMemory).
// Owned by one file and used by one thread at a time, as the file is. Without liburing
// at build time, or where the kernel refuses io_uring, Create returns null and writes
// stay synchronous.
class QueuedWriter {
 public:
  static constexpr size_t kChunk = BounceRegions::kSlotBytes;
  static constexpr unsigned kDepth = BounceRegions::kSlots;

#ifdef CKPTD_HAVE_LIBURING
  static std::unique_ptr<QueuedWriter> Create() {
    auto writer = std::unique_ptr<QueuedWriter>(new QueuedWriter);
    if (io_uring_queue_init(kDepth, &writer->ring_, 0) != 0) return nullptr;
    writer->initialized_ = true;
    writer->bounce_ = BounceRegions::Take();
    return writer;
  }
  ~QueuedWriter() {
    if (initialized_) io_uring_queue_exit(&ring_);
    BounceRegions::Give(bounce_);
  }

  // Writes n bytes from p at `offset` of fd in chunks, up to kDepth at a time. Returns
  // 0, or the errno of the first chunk that failed; either way no write is in flight
  // when it returns, so the caller may write the whole range again another way.
  int Write(int fd, const char* p, size_t n, uint64_t offset) {
    struct Chunk {
      const char* p;
      size_t n;
      uint64_t offset;
    };
    Chunk chunks[kDepth];
    std::vector<unsigned> free_slots;
    for (unsigned i = 0; i < kDepth; ++i) free_slots.push_back(i);
    // Memory in huge pages goes to the disk as it is: no copy.
    const bool in_place = direct_io_memory::Contains(p, n);
    if (in_place) direct_io_memory::CountInPlace(n);
    size_t next = 0;
    int error = 0;
    auto queue = [&](unsigned slot) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);  // never null: at most kDepth queued
      io_uring_prep_write(sqe, fd, chunks[slot].p, static_cast<unsigned>(chunks[slot].n),
                          chunks[slot].offset);
      io_uring_sqe_set_data64(sqe, slot);
    };
    while (free_slots.size() < kDepth || (next < n && error == 0)) {
      while (error == 0 && next < n && !free_slots.empty()) {
        const unsigned slot = free_slots.back();
        free_slots.pop_back();
        chunks[slot] = {p + next, std::min(kChunk, n - next), offset + next};
        if (bounce_ != nullptr && !in_place) {
          char* copy = bounce_ + slot * kChunk;
          std::memcpy(copy, chunks[slot].p, chunks[slot].n);
          chunks[slot].p = copy;
        }
        next += chunks[slot].n;
        queue(slot);
      }
      unsigned slot = 0;
      int res = 0;
      if (const int failed = ReapOne(&ring_, kDepth, free_slots, &slot, &res); failed != 0) return failed;
      Chunk& chunk = chunks[slot];
      if (res == -EINTR || res == -EAGAIN || (res > 0 && static_cast<size_t>(res) < chunk.n && error == 0)) {
        if (res > 0) chunk = {chunk.p + res, chunk.n - static_cast<size_t>(res), chunk.offset + res};
        queue(slot);  // the rest of a short or interrupted write
        continue;
      }
      if (res < 0 && error == 0) error = -res;
      if (res == 0 && error == 0) error = EIO;  // no progress: never loop forever
      free_slots.push_back(slot);
    }
    return error;
  }

 private:
  QueuedWriter() = default;
  io_uring ring_{};
  bool initialized_ = false;
  char* bounce_ = nullptr;  // each slot's chunk is copied here before it is queued
#else
  static std::unique_ptr<QueuedWriter> Create() { return nullptr; }
  int Write(int, const char*, size_t, uint64_t) { return ENOSYS; }
#endif
};

// Reads one range of an O_DIRECT descriptor through a pooled region's slots, with up
// to kSlots chunk reads in flight, and hands each chunk to `deliver` as it lands (in
// any order). One per call: a RandomAccessFile is read from several threads at once.
// Without liburing, or where the kernel refuses io_uring, Read returns kUnavailable
// and the caller reads another way.
class QueuedReader {
 public:
  static constexpr int kUnavailable = -1;
  static constexpr int kShrank = -2;  // a read found the file's end before the range's
  static constexpr size_t kChunk = BounceRegions::kSlotBytes;
  static constexpr unsigned kDepth = BounceRegions::kSlots;
  // (bytes from the range's start, the bytes, their count)
  using Deliver = std::function<void(uint64_t at, const char* data, size_t n)>;

#ifdef CKPTD_HAVE_LIBURING
  // Reads [offset, offset + n): offset and n are whole blocks. With `in_place` (memory
  // DirectIoMemory holds), each chunk is read straight to in_place + its offset and
  // handed to `deliver` there; otherwise through a region's slots. Returns 0, an
  // errno, or kUnavailable / kShrank; either way no read is in flight when it returns.
  static int Read(int fd, uint64_t offset, size_t n, const Deliver& deliver, char* in_place = nullptr) {
    io_uring ring{};
    if (io_uring_queue_init(kDepth, &ring, 0) != 0) return kUnavailable;
    char* region = in_place != nullptr ? nullptr : BounceRegions::Take();
    if (region == nullptr && in_place == nullptr) {
      io_uring_queue_exit(&ring);
      return kUnavailable;
    }
    auto target = [&](unsigned slot, uint64_t at) {
      return in_place != nullptr ? in_place + at : region + slot * kChunk;
    };
    struct Chunk {
      uint64_t at;  // from the range's start
      size_t n;
      size_t done;
    };
    Chunk chunks[kDepth];
    std::vector<unsigned> free_slots;
    for (unsigned i = 0; i < kDepth; ++i) free_slots.push_back(i);
    auto queue = [&](unsigned slot) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);  // never null: at most kDepth queued
      Chunk& c = chunks[slot];
      io_uring_prep_read(sqe, fd, target(slot, c.at) + c.done, static_cast<unsigned>(c.n - c.done),
                         offset + c.at + c.done);
      io_uring_sqe_set_data64(sqe, slot);
    };
    uint64_t next = 0;
    int error = 0;
    while (free_slots.size() < kDepth || (next < n && error == 0)) {
      while (error == 0 && next < n && !free_slots.empty()) {
        const unsigned slot = free_slots.back();
        free_slots.pop_back();
        chunks[slot] = {next, std::min<size_t>(kChunk, n - next), 0};
        next += chunks[slot].n;
        queue(slot);
      }
      unsigned slot = 0;
      int res = 0;
      if (const int failed = ReapOne(&ring, kDepth, free_slots, &slot, &res); failed != 0) {
        error = failed;
        break;
      }
      Chunk& chunk = chunks[slot];
      if (res == -EINTR || res == -EAGAIN) {
        queue(slot);
        continue;
      }
      if (res > 0) chunk.done += static_cast<size_t>(res);
      if (res > 0 && chunk.done < chunk.n && error == 0) {
        // A short read ends where the file does, or on a block: an unaligned rest
        // cannot be read with O_DIRECT, and the range was checked to lie in the file.
        if (chunk.done % 4096 != 0) {
          error = kShrank;
        } else {
          queue(slot);
          continue;
        }
      }
      if (res < 0 && error == 0) error = -res;
      if (res == 0 && error == 0) error = kShrank;
      if (error == 0) deliver(chunk.at, target(slot, chunk.at), chunk.n);
      free_slots.push_back(slot);
    }
    io_uring_queue_exit(&ring);
    BounceRegions::Give(region);
    return error;
  }
#else
  static int Read(int, uint64_t, size_t, const Deliver&, char* = nullptr) { return kUnavailable; }
#endif
};

// Large sequential writes with O_DIRECT: appends gather in an aligned buffer that is
// written in whole blocks; aligned appends bypass it, and a large one is written with
// several chunks in flight (QueuedWriter). The unaligned tail is written after clearing
// O_DIRECT, just before the fdatasync that makes everything durable.
class DirectWritableFile : public WritableFile {
 public:
  static constexpr size_t kBlock = 4096;
  static constexpr size_t kBufferBytes = 8 << 20;

  DirectWritableFile(std::string path, int fd, bool direct)
      : path_(std::move(path)), fd_(fd), direct_(direct) {}
  ~DirectWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
    std::free(buffer_);
  }

  absl::Status Append(absl::string_view data) override {
    while (!data.empty()) {
      const bool aligned = reinterpret_cast<uintptr_t>(data.data()) % kBlock == 0;
      if (aligned && data.size() >= kBlock && used_ % kBlock == 0) {
        RETURN_IF_ERROR(FlushBuffer());  // whole blocks: empties the buffer
        if (offset_ % kBlock == 0) {
          const size_t n = data.size() / kBlock * kBlock;
          RETURN_IF_ERROR(WriteQueued(data.data(), n));
          data.remove_prefix(n);
          continue;
        }
      }
      if (buffer_ == nullptr &&
          posix_memalign(reinterpret_cast<void**>(&buffer_), kBlock, kBufferBytes) != 0) {
        buffer_ = nullptr;
        return absl::ResourceExhaustedError(
            absl::StrCat("write ", path_, ": no memory for the write buffer"));
      }
      const size_t n = std::min(data.size(), kBufferBytes - used_);
      std::memcpy(buffer_ + used_, data.data(), n);
      used_ += n;
      data.remove_prefix(n);
      if (used_ == kBufferBytes) RETURN_IF_ERROR(FlushBuffer());
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (used_ > 0) {
      RETURN_IF_ERROR(DropDirect());
      RETURN_IF_ERROR(WriteAll(buffer_, used_));
      used_ = 0;
    }
    if (::fdatasync(fd_) != 0) return ErrnoToStatus(errno, absl::StrCat("fsync ", path_));
    return absl::OkStatus();
  }

  absl::Status Close() override {
    int fd = fd_;
    fd_ = -1;
    if (fd >= 0 && ::close(fd) != 0) return ErrnoToStatus(errno, absl::StrCat("close ", path_));
    return absl::OkStatus();
  }

 private:
  // Writes the buffer's whole blocks; keeps the remainder at its start.
  absl::Status FlushBuffer() {
    const size_t whole = used_ / kBlock * kBlock;
    if (whole == 0) return absl::OkStatus();
    RETURN_IF_ERROR(WriteAll(buffer_, whole));
    std::memmove(buffer_, buffer_ + whole, used_ - whole);
    used_ -= whole;
    return absl::OkStatus();
  }

  absl::Status DropDirect() {
    if (!direct_) return absl::OkStatus();
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("fcntl ", path_));
    }
    direct_ = false;
    return absl::OkStatus();
  }

  // As WriteAll, with chunks in flight where io_uring serves; any failure there falls
  // back to WriteAll over the whole range (positional writes may be repeated), which
  // then turns O_DIRECT off where the file system refuses it or reports the error.
  absl::Status WriteQueued(const char* p, size_t n) {
    if (direct_ && n >= 2 * QueuedWriter::kChunk && !queue_refused_) {
      if (queue_ == nullptr) queue_ = QueuedWriter::Create();
      if (queue_ != nullptr && queue_->Write(fd_, p, n, offset_) == 0) {
        offset_ += n;
        return absl::OkStatus();
      }
      queue_refused_ = true;  // unavailable or refused here: stay synchronous
    }
    return WriteAll(p, n);
  }

  absl::Status WriteAll(const char* p, size_t n) {
    while (n > 0) {
      ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset_));
      if (w < 0) {
        if (errno == EINTR) continue;
        // Some file systems accept O_DIRECT at open and refuse it at write.
        if (errno == EINVAL && direct_) {
          RETURN_IF_ERROR(DropDirect());
          continue;
        }
        return ErrnoToStatus(errno, absl::StrCat("write ", path_));
      }
      p += w;
      n -= static_cast<size_t>(w);
      offset_ += static_cast<uint64_t>(w);
    }
    return absl::OkStatus();
  }

  std::string path_;
  int fd_;
  bool direct_;
  char* buffer_ = nullptr;
  size_t used_ = 0;
  uint64_t offset_ = 0;
  std::unique_ptr<QueuedWriter> queue_;
  bool queue_refused_ = false;
};

// Opens with O_DIRECT, or without it where the file system refuses it.
absl::StatusOr<std::unique_ptr<WritableFile>> OpenDirect(const std::string& path,
                                                         const std::function<int(int extra_flags)>& open) {
  bool direct = true;
  int fd = open(O_DIRECT);
  if (fd < 0 && errno == EINVAL) {
    direct = false;
    fd = open(0);
  }
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("create ", path));
  return std::unique_ptr<WritableFile>(new DirectWritableFile(path, fd, direct));
}

// Reads with pread. Large reads at 4 KiB-aligned offsets go through a second
// descriptor opened with O_DIRECT (the same file, reopened via /proc/self/fd), which
// skips the page cache: through QueuedReader's slots into memory at any address, in
// place into memory in huge pages (DirectIoMemory), or without io_uring straight into
// 4 KiB-aligned memory. The unaligned tail, and every read where the file system
// refuses O_DIRECT, use the buffered descriptor.
class PosixRandomAccessFile : public RandomAccessFile {
 public:
  static constexpr size_t kBlock = 4096;
  static constexpr size_t kDirectFrom = 256 << 10;

  PosixRandomAccessFile(std::string path, int fd, uint64_t size)
      : path_(std::move(path)), fd_(fd), size_(size) {
    const std::string self = absl::StrCat("/proc/self/fd/", fd);
    direct_fd_ = ::open(self.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  }
  ~PosixRandomAccessFile() override {
    ::close(fd_);
    if (direct_fd_ >= 0) ::close(direct_fd_);
  }

  absl::Status Read(uint64_t offset, size_t n, char* dst) const override {
    if (offset > size_ || n > size_ - offset) {
      return absl::OutOfRangeError(absl::StrCat("read ", path_, ": bytes [", offset, ", ", offset + n,
                                                ") lie past its end (", size_, ")"));
    }
    if (direct_ok_.load(std::memory_order_relaxed) && direct_fd_ >= 0 && n >= kDirectFrom &&
        offset % kBlock == 0) {
      const size_t whole = n / kBlock * kBlock;
      // Into memory in huge pages in place; into any other through the slots.
      char* in_place = direct_io_memory::Contains(dst, whole) ? dst : nullptr;
      if (in_place != nullptr) direct_io_memory::CountInPlace(whole);
      std::optional<absl::Status> s = ReadQueued(
          offset, whole,
          [dst](uint64_t at, const char* data, size_t len) {
            if (data != dst + at) std::memcpy(dst + at, data, len);
          },
          in_place);
      if (!s.has_value() && reinterpret_cast<uintptr_t>(dst) % kBlock == 0) {
        s = ReadFrom(direct_fd_, offset, whole, dst);
      }
      if (s.has_value()) {
        if (s->ok()) return ReadFrom(fd_, offset + whole, n - whole, dst + whole);
        if (!absl::IsInvalidArgument(*s)) return *s;
        direct_ok_ = false;  // refused after all: buffered from now on
      }
    }
    return ReadFrom(fd_, offset, n, dst);
  }

  uint64_t Size() const override { return size_; }

  absl::Status ReadV(uint64_t offset, const std::vector<absl::Span<char>>& pieces) const override {
    uint64_t total = 0;
    bool aligned = offset % kBlock == 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      total += pieces[i].size();
      // Every piece but the last whole blocks at aligned addresses; the last one's
      // tail past its whole blocks is read buffered.
      aligned = aligned && reinterpret_cast<uintptr_t>(pieces[i].data()) % kBlock == 0 &&
                (i + 1 == pieces.size() || pieces[i].size() % kBlock == 0);
    }
    if (offset > size_ || total > size_ - offset) {
      return absl::OutOfRangeError(absl::StrCat("read ", path_, ": bytes [", offset, ", ", offset + total,
                                                ") lie past its end (", size_, ")"));
    }
    if (!aligned || pieces.size() < 2 || !direct_ok_.load(std::memory_order_relaxed) || direct_fd_ < 0) {
      return RandomAccessFile::ReadV(offset, pieces);
    }
    const size_t tail = pieces.back().size() % kBlock;
    std::vector<uint64_t> starts;  // of each piece, from `offset`
    for (uint64_t at = 0; const absl::Span<char>& piece : pieces) {
      starts.push_back(at);
      at += piece.size();
    }
    std::optional<absl::Status> queued =
        ReadQueued(offset, total - tail, [&](uint64_t at, const char* data, size_t len) {
          size_t i =
              static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), at) - starts.begin()) - 1;
          for (; len > 0; ++i) {
            const size_t in = static_cast<size_t>(at - starts[i]);
            const size_t take = std::min(len, pieces[i].size() - in);
            std::memcpy(pieces[i].data() + in, data, take);
            at += take;
            data += take;
            len -= take;
          }
        });
    if (queued.has_value()) {
      if (!queued->ok() && absl::IsInvalidArgument(*queued)) {
        direct_ok_ = false;  // refused after all: buffered from now on
        return RandomAccessFile::ReadV(offset, pieces);
      }
      if (!queued->ok() || tail == 0) return *queued;
      return ReadFrom(fd_, offset + total - tail, tail, pieces.back().data() + (pieces.back().size() - tail));
    }
    // Without io_uring: one preadv straight into the pieces.
    std::vector<iovec> iov;
    for (const absl::Span<char>& piece : pieces) iov.push_back({piece.data(), piece.size()});
    iov.back().iov_len -= tail;
    if (iov.back().iov_len == 0) iov.pop_back();
    const uint64_t whole = total - tail;
    size_t first = 0;
    for (uint64_t done = 0; done < whole;) {
      const ssize_t got = ::preadv(direct_fd_, iov.data() + first,
                                   static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX)),
                                   static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && errno == EINVAL && done == 0) {
        direct_ok_ = false;  // refused after all: buffered from now on
        return RandomAccessFile::ReadV(offset, pieces);
      }
      if (got < 0) return ErrnoToStatus(errno, absl::StrCat("read ", path_));
      if (got == 0) return absl::DataLossError(absl::StrCat("read ", path_, ": file shrank"));
      done += static_cast<uint64_t>(got);
      for (size_t left = static_cast<size_t>(got); left > 0;) {  // past what was read
        const size_t step = std::min(left, iov[first].iov_len);
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + step;
        iov[first].iov_len -= step;
        left -= step;
        if (iov[first].iov_len == 0) ++first;
      }
    }
    if (tail == 0) return absl::OkStatus();
    return ReadFrom(fd_, offset + whole, tail, pieces.back().data() + (pieces.back().size() - tail));
  }

 private:
  // Whole blocks [offset, offset + n) through QueuedReader; nullopt where it is
  // unavailable (the caller reads straight into its memory instead).
  std::optional<absl::Status> ReadQueued(uint64_t offset, size_t n, const QueuedReader::Deliver& deliver,
                                         char* in_place = nullptr) const {
    const int rc = QueuedReader::Read(direct_fd_, offset, n, deliver, in_place);
    if (rc == QueuedReader::kUnavailable) return std::nullopt;
    if (rc == QueuedReader::kShrank)
      return absl::DataLossError(absl::StrCat("read ", path_, ": file shrank"));
    if (rc != 0) return ErrnoToStatus(rc, absl::StrCat("read ", path_));
    return absl::OkStatus();
  }

  absl::Status ReadFrom(int fd, uint64_t offset, size_t n, char* dst) const {
    while (n > 0) {
      ssize_t got = ::pread(fd, dst, n, static_cast<off_t>(offset));
      if (got < 0) {
        if (errno == EINTR) continue;
        return ErrnoToStatus(errno, absl::StrCat("read ", path_));
      }
      if (got == 0) return absl::DataLossError(absl::StrCat("read ", path_, ": file shrank"));
      dst += got;
      offset += static_cast<uint64_t>(got);
      n -= static_cast<size_t>(got);
    }
    return absl::OkStatus();
  }

  std::string path_;
  int fd_;
  int direct_fd_ = -1;
  mutable std::atomic<bool> direct_ok_{true};
  uint64_t size_;
};

class PosixFs : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("create ", path));
    return std::make_unique<PosixWritableFile>(path, fd);
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewDirectWritableFile(const std::string& path) override {
    return OpenDirect(path, [&](int extra) {
      return ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | extra, 0644);
    });
  }

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      return ErrnoToStatus(err, absl::StrCat("stat ", path));
    }
    return std::make_unique<PosixRandomAccessFile>(path, fd, static_cast<uint64_t>(st.st_size));
  }

  absl::Status CreateDir(const std::string& path, uint32_t mode) override {
    if (::mkdir(path.c_str(), mode) != 0) return ErrnoToStatus(errno, absl::StrCat("mkdir ", path));
    return absl::OkStatus();
  }

  absl::Status SetMode(const std::string& path, uint32_t mode) override {
    if (::chmod(path.c_str(), mode) != 0) return ErrnoToStatus(errno, absl::StrCat("chmod ", path));
    return absl::OkStatus();
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("rename ", from, " -> ", to));
    }
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open dir ", path));
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoToStatus(err, absl::StrCat("fsync dir ", path));
    return absl::OkStatus();
  }

  absl::Status DeleteFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return ErrnoToStatus(errno, absl::StrCat("unlink ", path));
    return absl::OkStatus();
  }

  absl::Status DeleteRecursively(const std::string& path) override {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) return absl::OkStatus();
      return ErrnoToStatus(errno, absl::StrCat("stat ", path));
    }
    if (S_ISDIR(st.st_mode)) {
      ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(path));
      for (const std::string& name : names) {
        RETURN_IF_ERROR(DeleteRecursively(JoinPath(path, name)));
      }
      if (::rmdir(path.c_str()) != 0) return ErrnoToStatus(errno, absl::StrCat("rmdir ", path));
      return absl::OkStatus();
    }
    return DeleteFile(path);
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) return ErrnoToStatus(errno, absl::StrCat("opendir ", path));
    std::vector<std::string> names;
    while (struct dirent* e = ::readdir(dir)) {
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      names.emplace_back(e->d_name);
    }
    ::closedir(dir);
    return names;
  }

  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path));
    return static_cast<uint64_t>(st.st_size);
  }

  bool IsDirectory(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }

  bool Exists(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
  }
};

}  // namespace

FileSystem* PosixFileSystem() {
  static FileSystem* fs = new PosixFs();
  return fs;
}

}  // namespace ckptd

// ---------------------------------------------------------------------------
// Confined file system.

#include <linux/openat2.h>
#include <sys/syscall.h>

#include "absl/strings/str_split.h"

namespace ckptd {
namespace {

class ConfinedFs : public FileSystem {
 public:
  ConfinedFs(std::string root, int root_fd, uint32_t file_mode)
      : root_(std::move(root)), root_fd_(root_fd), file_mode_(file_mode) {}
  ~ConfinedFs() override { ::close(root_fd_); }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    ASSIGN_OR_RETURN(Entry e, Parent(path));
    // Replace whatever is there (never through it): unlink, then create exclusively.
    if (::unlinkat(e.dir_fd, e.name.c_str(), 0) != 0 && errno != ENOENT) {
      return ErrnoToStatus(errno, absl::StrCat("create ", path));
    }
    int fd =
        ::openat(e.dir_fd, e.name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, file_mode_);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("create ", path));
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewDirectWritableFile(const std::string& path) override {
    ASSIGN_OR_RETURN(Entry e, Parent(path));
    if (::unlinkat(e.dir_fd, e.name.c_str(), 0) != 0 && errno != ENOENT) {
      return ErrnoToStatus(errno, absl::StrCat("create ", path));
    }
    return OpenDirect(path, [&](int extra) {
      // A refused O_DIRECT may leave the file created: remove it before the retry.
      if (extra == 0) ::unlinkat(e.dir_fd, e.name.c_str(), 0);
      return ::openat(e.dir_fd, e.name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | extra,
                      file_mode_);
    });
  }

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override {
    ASSIGN_OR_RETURN(int fd, OpenBeneath(path, O_RDONLY | O_CLOEXEC));
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
    }
    return std::unique_ptr<RandomAccessFile>(
        new PosixRandomAccessFile(path, fd, static_cast<uint64_t>(st.st_size)));
  }

  absl::Status CreateDir(const std::string& path, uint32_t mode) override {
    ASSIGN_OR_RETURN(Entry e, Parent(path));
    if (::mkdirat(e.dir_fd, e.name.c_str(), mode) != 0)
      return ErrnoToStatus(errno, absl::StrCat("mkdir ", path));
    return absl::OkStatus();
  }

  absl::Status SetMode(const std::string& path, uint32_t mode) override {
    ASSIGN_OR_RETURN(Entry e, Parent(path));
    struct stat st;
    if (::fstatat(e.dir_fd, e.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("chmod ", path));
    }
    if (S_ISLNK(st.st_mode)) return ErrnoToStatus(ELOOP, absl::StrCat("chmod ", path));
    if (::fchmodat(e.dir_fd, e.name.c_str(), mode, 0) != 0)
      return ErrnoToStatus(errno, absl::StrCat("chmod ", path));
    return absl::OkStatus();
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    ASSIGN_OR_RETURN(Entry a, Parent(from));
    ASSIGN_OR_RETURN(Entry b, Parent(to));
    if (::renameat(a.dir_fd, a.name.c_str(), b.dir_fd, b.name.c_str()) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("rename ", from, " -> ", to));
    }
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& path) override {
    ASSIGN_OR_RETURN(int fd, OpenBeneath(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoToStatus(err, absl::StrCat("fsync dir ", path));
    return absl::OkStatus();
  }

  absl::Status DeleteFile(const std::string& path) override {
    ASSIGN_OR_RETURN(Entry e, Parent(path));
    if (::unlinkat(e.dir_fd, e.name.c_str(), 0) != 0)
      return ErrnoToStatus(errno, absl::StrCat("unlink ", path));
    return absl::OkStatus();
  }

  absl::Status DeleteRecursively(const std::string& path) override {
    absl::StatusOr<Entry> parent = Parent(path);
    if (absl::IsNotFound(parent.status())) return absl::OkStatus();  // nothing there
    ASSIGN_OR_RETURN(Entry e, std::move(parent));
    struct stat st;
    if (::fstatat(e.dir_fd, e.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) return absl::OkStatus();
      return ErrnoToStatus(errno, absl::StrCat("stat ", path));
    }
    if (S_ISDIR(st.st_mode)) {  // a symlink is removed itself, never followed
      ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(path));
      for (const std::string& name : names) RETURN_IF_ERROR(DeleteRecursively(JoinPath(path, name)));
    }
    if (::unlinkat(e.dir_fd, e.name.c_str(), S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("remove ", path));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    ASSIGN_OR_RETURN(int fd, OpenBeneath(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    DIR* dir = ::fdopendir(fd);
    if (dir == nullptr) {
      ::close(fd);
      return ErrnoToStatus(errno, absl::StrCat("opendir ", path));
    }
    std::vector<std::string> names;
    while (struct dirent* d = ::readdir(dir)) {
      if (std::strcmp(d->d_name, ".") == 0 || std::strcmp(d->d_name, "..") == 0) continue;
      names.emplace_back(d->d_name);
    }
    ::closedir(dir);
    return names;
  }

  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    ASSIGN_OR_RETURN(struct stat st, Stat(path));
    return static_cast<uint64_t>(st.st_size);
  }
  bool IsDirectory(const std::string& path) override {
    auto st = Stat(path);
    return st.ok() && S_ISDIR(st->st_mode);
  }
  bool Exists(const std::string& path) override { return Stat(path).ok(); }

 private:
  // A directory fd (beneath the root) and an entry name in it; closes the fd.
  struct Entry {
    int dir_fd = -1;
    std::string name;
    Entry() = default;
    Entry(int fd, std::string n) : dir_fd(fd), name(std::move(n)) {}
    Entry(Entry&& o) noexcept : dir_fd(o.dir_fd), name(std::move(o.name)) { o.dir_fd = -1; }
    Entry& operator=(Entry&& o) noexcept {
      std::swap(dir_fd, o.dir_fd);
      name = std::move(o.name);
      return *this;
    }
    ~Entry() {
      if (dir_fd >= 0) ::close(dir_fd);
    }
  };

  // `path` relative to the root ("." for the root itself). Rejects paths outside it
  // and any ".." component.
  absl::StatusOr<std::string> Relative(const std::string& path) const {
    if (path == root_) return std::string(".");
    if (path.compare(0, root_.size() + 1, root_ + "/") != 0) {
      return absl::PermissionDeniedError(absl::StrCat(path, " is outside the checkpoint root ", root_));
    }
    std::string rel = path.substr(root_.size() + 1);
    for (absl::string_view part : absl::StrSplit(rel, '/')) {
      if (part == "..") return absl::PermissionDeniedError(absl::StrCat(path, ": '..' is not allowed"));
    }
    return rel.empty() ? std::string(".") : rel;
  }

  absl::StatusOr<int> OpenBeneath(const std::string& path, int flags) const {
    ASSIGN_OR_RETURN(std::string rel, Relative(path));
    struct open_how how = {};
    how.flags = static_cast<uint64_t>(flags | O_NOFOLLOW);
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    // openat2 with RESOLVE_BENEATH fails with EAGAIN when any rename on the system
    // races the lookup (the kernel's rename seqlock moved); the kernel asks callers to
    // retry. Unretried, an unrelated rename made a stat look like an error.
    long fd = -1;
    for (int attempt = 0; attempt < 100; ++attempt) {
      fd = ::syscall(SYS_openat2, root_fd_, rel.c_str(), &how, sizeof(how));
      if (fd >= 0 || errno != EAGAIN) break;
    }
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path, " beneath ", root_));
    return static_cast<int>(fd);
  }

  absl::StatusOr<Entry> Parent(const std::string& path) const {
    if (path == root_) return absl::PermissionDeniedError("the checkpoint root itself cannot be changed");
    ASSIGN_OR_RETURN(int fd, OpenBeneath(DirName(path), O_PATH | O_DIRECTORY | O_CLOEXEC));
    return Entry(fd, path.substr(path.rfind('/') + 1));
  }

  absl::StatusOr<struct stat> Stat(const std::string& path) const {
    struct stat st;
    if (path == root_) {
      if (::fstat(root_fd_, &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path));
      return st;
    }
    ASSIGN_OR_RETURN(Entry e, Parent(path));
    if (::fstatat(e.dir_fd, e.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("stat ", path));
    }
    return st;
  }

  std::string root_;
  int root_fd_;
  uint32_t file_mode_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<FileSystem>> ConfinedFileSystem(const std::string& root, uint32_t file_mode) {
  char resolved[PATH_MAX];
  if (::realpath(root.c_str(), resolved) == nullptr)
    return ErrnoToStatus(errno, absl::StrCat("resolve ", root));
  int fd = ::open(resolved, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", resolved));
  struct open_how how = {};
  how.flags = O_PATH | O_DIRECTORY;
  how.resolve = RESOLVE_BENEATH;
  const long probe = ::syscall(SYS_openat2, fd, ".", &how, sizeof(how));
  if (probe < 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, "openat2 (Linux 5.6+) is needed to confine file access");
  }
  ::close(static_cast<int>(probe));
  return std::unique_ptr<FileSystem>(new ConfinedFs(resolved, fd, file_mode));
}

}  // namespace ckptd
