#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

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
#include "daemon/io/posix_files.h"
#include "daemon/io/uring_queue.h"

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

using io_queue::QueuedReader;
using io_queue::QueuedWriter;

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
  explicit PosixFs(uint32_t file_mode) : file_mode_(file_mode) {}

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, file_mode_);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("create ", path));
    return std::make_unique<PosixWritableFile>(path, fd);
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewDirectWritableFile(const std::string& path) override {
    return OpenDirect(path, [&](int extra) {
      return ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | extra, file_mode_);
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
    // A pipe or a device has no size to read up to: it would read as empty (a config
    // from /dev/stdin silently all defaults), so it is refused by name.
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(path, " is not a regular file (a pipe or a device?): write it to a file first"));
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

  absl::StatusOr<uint64_t> FreeBytes(const std::string& path) override {
    struct statvfs fs;
    if (::statvfs(path.c_str(), &fs) != 0) return ErrnoToStatus(errno, absl::StrCat("statvfs ", path));
    return static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  }

 private:
  const uint32_t file_mode_;  // of files it creates, before the umask
};

}  // namespace

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

std::unique_ptr<WritableFile> NewPosixWritableFile(std::string path, int fd) {
  return std::make_unique<PosixWritableFile>(std::move(path), fd);
}

std::unique_ptr<RandomAccessFile> NewPosixRandomAccessFile(std::string path, int fd, uint64_t size) {
  return std::make_unique<PosixRandomAccessFile>(std::move(path), fd, size);
}

FileSystem* PosixFileSystem() {
  static FileSystem* fs = new PosixFs(0644);
  return fs;
}

std::unique_ptr<FileSystem> PosixFileSystemCreating(uint32_t file_mode) {
  return std::make_unique<PosixFs>(file_mode);
}

}  // namespace ckptd
