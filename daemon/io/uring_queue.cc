#include "daemon/io/uring_queue.h"

#include <sys/mman.h>

#ifdef CKPTD_HAVE_LIBURING
#include <liburing.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "daemon/io/direct_io_memory.h"

namespace ckptd::io_queue {
namespace {

// The pool of idle regions; never destroyed, since a file may give its region back
// while the process exits.
std::mutex& mu() {
  static std::mutex* m = new std::mutex;
  return *m;
}

std::vector<char*>& idle() {
  static std::vector<char*>* v = new std::vector<char*>;
  return *v;
}

}  // namespace

char* BounceRegions::Take() {
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

void BounceRegions::Give(char* region) {
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

#ifdef CKPTD_HAVE_LIBURING
namespace {

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

}  // namespace

struct QueuedWriter::Ring {
  io_uring ring{};
  bool initialized = false;
};

QueuedWriter::QueuedWriter() : ring_(std::make_unique<Ring>()) {}

std::unique_ptr<QueuedWriter> QueuedWriter::Create() {
  auto writer = std::unique_ptr<QueuedWriter>(new QueuedWriter);
  if (io_uring_queue_init(kDepth, &writer->ring_->ring, 0) != 0) return nullptr;
  writer->ring_->initialized = true;
  writer->bounce_ = BounceRegions::Take();
  return writer;
}

QueuedWriter::~QueuedWriter() {
  if (ring_->initialized) io_uring_queue_exit(&ring_->ring);
  BounceRegions::Give(bounce_);
}

int QueuedWriter::Write(int fd, const char* p, size_t n, uint64_t offset) {
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
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);  // never null: at most kDepth queued
    io_uring_prep_write(sqe, fd, chunks[slot].p, static_cast<unsigned>(chunks[slot].n), chunks[slot].offset);
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
    if (const int failed = ReapOne(&ring_->ring, kDepth, free_slots, &slot, &res); failed != 0) return failed;
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

int QueuedReader::Read(int fd, uint64_t offset, size_t n, const Deliver& deliver, char* in_place) {
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

struct QueuedWriter::Ring {};
QueuedWriter::QueuedWriter() = default;
QueuedWriter::~QueuedWriter() = default;
std::unique_ptr<QueuedWriter> QueuedWriter::Create() { return nullptr; }
int QueuedWriter::Write(int, const char*, size_t, uint64_t) { return ENOSYS; }
int QueuedReader::Read(int, uint64_t, size_t, const Deliver&, char*) { return kUnavailable; }

#endif

}  // namespace ckptd::io_queue
