// DirectIoMemory: the ranges of this process's memory that O_DIRECT reads and writes
// may use in place, without going through BounceRegions' slots first.
//
// A direct request is built from the physical pages behind its buffer, and a request
// holds at most max_segments runs of contiguous pages (254 on virtio-blk). Memory in
// 4 KiB pages scattered across physical memory (a trainer's ordinary memfd) makes
// small requests, so the file layer copies through huge-page slots instead (see
// BounceRegions in posix_file_system.cc). Memory in huge pages (a trainer's segment
// made with MFD_HUGETLB) is contiguous in 2 MiB runs: reading into it or writing
// from it in place saves that copy. Whoever maps such memory registers it here and
// removes it before unmapping it (SharedSegment does both); the file layer asks
// Contains before every large direct read or write.
// Thread-safe: Add, Remove and Contains may run on any threads at once.
#ifndef CKPTD_DAEMON_IO_DIRECT_IO_MEMORY_H_
#define CKPTD_DAEMON_IO_DIRECT_IO_MEMORY_H_

#include <cstddef>
#include <cstdint>

namespace ckptd::direct_io_memory {

// Registers [begin, begin + bytes). Ranges never overlap (each is one mapping).
void Add(const void* begin, size_t bytes);
// Removes the range that starts at `begin` (no-op where none does).
void Remove(const void* begin);
// True when [p, p + n) lies inside one registered range and p is 4 KiB-aligned.
bool Contains(const void* p, size_t n);

// Bytes the file layer has read or written in place so far (it counts them), for
// tests and metrics: whether huge-page segments are doing their job.
void CountInPlace(size_t bytes);
uint64_t InPlaceBytes();

}  // namespace ckptd::direct_io_memory

#endif  // CKPTD_DAEMON_IO_DIRECT_IO_MEMORY_H_
