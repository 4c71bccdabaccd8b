#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/base/status.h"
#include "daemon/io/file_system.h"
#include "daemon/io/posix_files.h"

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
    return NewPosixWritableFile(path, fd);
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
    return NewPosixRandomAccessFile(path, fd, static_cast<uint64_t>(st.st_size));
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
  absl::StatusOr<uint64_t> FreeBytes(const std::string& path) override {
    // Every path beneath the root is on the root's file system or one mounted below it;
    // the root's own figure is the one the daemon needs.
    struct statvfs fs;
    if (::fstatvfs(root_fd_, &fs) != 0) return ErrnoToStatus(errno, absl::StrCat("statvfs ", path));
    return static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  }

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
