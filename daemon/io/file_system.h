// FileSystem: the one door through which ckptd touches files. The daemon uses the
// POSIX implementation; tests substitute implementations that inject faults.
// Implementations must be thread-safe; a file object is used by one thread at a time.
#ifndef CKPTD_DAEMON_IO_FILE_SYSTEM_H_
#define CKPTD_DAEMON_IO_FILE_SYSTEM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ckptd {

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual absl::Status Append(absl::string_view data) = 0;
  // Makes everything appended so far durable. After a failed Sync the file's state
  // is unknown: callers abandon the file rather than retry.
  virtual absl::Status Sync() = 0;
  virtual absl::Status Close() = 0;
};

class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Reads exactly n bytes at offset into dst; reading past the end is OUT_OF_RANGE.
  virtual absl::Status Read(uint64_t offset, size_t n, char* dst) const = 0;
  virtual uint64_t Size() const = 0;
  // Where bytes [offset, offset + n) already lie in this process's memory, contiguous
  // and unchanging while the file is open, and already checked against the checksums
  // the file was written with: a reader copies them without reading or checking them
  // again. Null when they do not (Read them).
  virtual const char* InMemory(uint64_t offset, size_t n) const {
    (void)offset;
    (void)n;
    return nullptr;
  }
  // Reads consecutive bytes from `offset` into `pieces`, in order, as one request
  // where the file can (preadv): a large read into many buffers. This default reads
  // piece by piece.
  virtual absl::Status ReadV(uint64_t offset, const std::vector<absl::Span<char>>& pieces) const {
    for (const absl::Span<char>& piece : pieces) {
      if (absl::Status s = Read(offset, piece.size(), piece.data()); !s.ok()) return s;
      offset += piece.size();
    }
    return absl::OkStatus();
  }
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // Creates or truncates `path` for writing.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  virtual absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) = 0;
  // As NewWritableFile, for large sequential writes: the file bypasses the page cache
  // (O_DIRECT) where the file system allows it, and falls back to buffered writes
  // where it does not (tmpfs). Appends of any size and alignment work; a 4 KiB-aligned
  // append starting at a 4 KiB-aligned file offset is written straight from the
  // caller's memory. Sync semantics are those of WritableFile.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewDirectWritableFile(const std::string& path) {
    return NewWritableFile(path);
  }

  // ALREADY_EXISTS if it exists (as anything).
  virtual absl::Status CreateDir(const std::string& path, uint32_t mode) = 0;
  virtual absl::Status SetMode(const std::string& path, uint32_t mode) = 0;
  // Atomic replace, as rename(2).
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  // Makes the directory's entries (creations, renames) durable.
  virtual absl::Status SyncDir(const std::string& path) = 0;
  virtual absl::Status DeleteFile(const std::string& path) = 0;
  // Removes a file or a directory tree; OK if it does not exist.
  virtual absl::Status DeleteRecursively(const std::string& path) = 0;
  // Entry names (no "." or ".."), unsorted.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) = 0;
  virtual absl::StatusOr<uint64_t> FileSize(const std::string& path) = 0;
  virtual bool IsDirectory(const std::string& path) = 0;
  virtual bool Exists(const std::string& path) = 0;
  // Bytes an unprivileged writer may still write on the file system holding `path`
  // (statvfs f_bavail); UNIMPLEMENTED where a file system cannot tell.
  virtual absl::StatusOr<uint64_t> FreeBytes(const std::string& path) {
    return absl::UnimplementedError(absl::StrCat("free space of ", path, " is unknown here"));
  }

  // Helpers built on the primitives above.

  // mkdir -p; created directories get `mode`.
  absl::Status CreateDirs(const std::string& path, uint32_t mode);
  // Whole file; RESOURCE_EXHAUSTED if larger than max_bytes.
  absl::StatusOr<std::string> ReadFileToString(const std::string& path, uint64_t max_bytes);
  // Writes `path.tmp`, syncs it, renames it over `path` and syncs the directory.
  absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);
};

// Forwards every call to `target` (LevelDB's EnvWrapper): a test file system overrides
// only what it changes and still passes on every other method, the O_DIRECT writer
// included. Does not own `target`, which must outlive it.
class FileSystemWrapper : public FileSystem {
 public:
  explicit FileSystemWrapper(FileSystem* target) : target_(target) {}
  FileSystem* target() const { return target_; }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    return target_->NewWritableFile(path);
  }
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override {
    return target_->NewRandomAccessFile(path);
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> NewDirectWritableFile(const std::string& path) override {
    return target_->NewDirectWritableFile(path);
  }
  absl::Status CreateDir(const std::string& path, uint32_t mode) override {
    return target_->CreateDir(path, mode);
  }
  absl::Status SetMode(const std::string& path, uint32_t mode) override {
    return target_->SetMode(path, mode);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return target_->Rename(from, to);
  }
  absl::Status SyncDir(const std::string& path) override { return target_->SyncDir(path); }
  absl::Status DeleteFile(const std::string& path) override { return target_->DeleteFile(path); }
  absl::Status DeleteRecursively(const std::string& path) override {
    return target_->DeleteRecursively(path);
  }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    return target_->ListDir(path);
  }
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override { return target_->FileSize(path); }
  bool IsDirectory(const std::string& path) override { return target_->IsDirectory(path); }
  bool Exists(const std::string& path) override { return target_->Exists(path); }
  absl::StatusOr<uint64_t> FreeBytes(const std::string& path) override { return target_->FreeBytes(path); }

 private:
  FileSystem* target_;
};

// The process-wide POSIX implementation; files it creates are 0644 (before the
// umask). Never null; lives forever.
FileSystem* PosixFileSystem();
// The same, creating files with `file_mode` (0600 for a checkpoint's files).
std::unique_ptr<FileSystem> PosixFileSystemCreating(uint32_t file_mode);

// A POSIX file system confined beneath `root` (an existing directory): every path
// must lie under it; files are reached with openat2(RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS) from the root, so no symlink or ".." can lead outside; new
// files are created O_EXCL|O_NOFOLLOW with `file_mode` (checkpoints are private to
// their owner by default). A path outside the root is PERMISSION_DENIED; one through
// a symlink fails with ELOOP's status. Thread-safe.
absl::StatusOr<std::unique_ptr<FileSystem>> ConfinedFileSystem(const std::string& root,
                                                               uint32_t file_mode = 0600);

std::string JoinPath(absl::string_view a, absl::string_view b);
std::string DirName(absl::string_view path);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_IO_FILE_SYSTEM_H_
