// The io_uring queue under the POSIX file system's O_DIRECT files: pooled huge-page
// regions that direct writes and reads are copied through, and the queued writer and
// reader that keep several chunk requests of one large range in flight. Internal to
// daemon/io (posix_file_system.cc); without liburing at build time, or where the
// kernel refuses io_uring, the writer is not created and the reader says so, and the
// file reads and writes another way.
#ifndef CKPTD_DAEMON_IO_URING_QUEUE_H_
#define CKPTD_DAEMON_IO_URING_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

namespace ckptd::io_queue {

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
class BounceRegions {
 public:
  static constexpr size_t kSlots = 16;
  static constexpr size_t kSlotBytes = 4 << 20;
  static constexpr size_t kBytes = kSlots * kSlotBytes;

  // A region, or null where no memory is left (writes then go from the source).
  static char* Take();
  // Keeps up to kIdle regions for the next reader or writer; frees the rest.
  static void Give(char* region);

 private:
  static constexpr size_t kIdle = 4;  // a restore reads with several threads
};

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

  // Null where io_uring cannot be had.
  static std::unique_ptr<QueuedWriter> Create();
  ~QueuedWriter();
  QueuedWriter(const QueuedWriter&) = delete;
  QueuedWriter& operator=(const QueuedWriter&) = delete;

  // Writes n bytes from p at `offset` of fd in chunks, up to kDepth at a time. Returns
  // 0, or the errno of the first chunk that failed; either way no write is in flight
  // when it returns, so the caller may write the whole range again another way.
  int Write(int fd, const char* p, size_t n, uint64_t offset);

 private:
  struct Ring;  // the io_uring, kept out of this header
  QueuedWriter();
  std::unique_ptr<Ring> ring_;
  char* bounce_ = nullptr;  // each slot's chunk is copied here before it is queued
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

  // Reads [offset, offset + n): offset and n are whole blocks. With `in_place` (memory
  // DirectIoMemory holds), each chunk is read straight to in_place + its offset and
  // handed to `deliver` there; otherwise through a region's slots. Returns 0, an
  // errno, or kUnavailable / kShrank; either way no read is in flight when it returns.
  static int Read(int fd, uint64_t offset, size_t n, const Deliver& deliver, char* in_place = nullptr);
};

}  // namespace ckptd::io_queue

#endif  // CKPTD_DAEMON_IO_URING_QUEUE_H_
