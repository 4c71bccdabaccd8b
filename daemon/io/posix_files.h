// The POSIX file classes, for the file systems of daemon/io that open files their own
// way (ConfinedFileSystem opens beneath its root with openat2) but read and write
// them as PosixFileSystem does. Internal to daemon/io. Each takes ownership of `fd`.
#ifndef CKPTD_DAEMON_IO_POSIX_FILES_H_
#define CKPTD_DAEMON_IO_POSIX_FILES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/io/file_system.h"

namespace ckptd {

// Buffered writes with write(2); Sync is fdatasync.
std::unique_ptr<WritableFile> NewPosixWritableFile(std::string path, int fd);

// Reads with pread, large aligned ones with O_DIRECT through the io_uring queue.
std::unique_ptr<RandomAccessFile> NewPosixRandomAccessFile(std::string path, int fd, uint64_t size);

// A file for large sequential O_DIRECT writes: `open(extra_flags)` opens it with
// O_DIRECT added, or (where the file system refuses it with EINVAL) without.
absl::StatusOr<std::unique_ptr<WritableFile>> OpenDirect(const std::string& path,
                                                         const std::function<int(int extra_flags)>& open);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_IO_POSIX_FILES_H_
