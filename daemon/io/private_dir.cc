#include "daemon/io/private_dir.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"
#include "daemon/io/file_system.h"

namespace ckptd {

absl::Status PreparePrivateDirectory(const std::string& path, gid_t group, absl::string_view setting) {
  const bool grouped = group != kNoGroup;
  RETURN_IF_ERROR(PosixFileSystem()->CreateDirs(path, grouped ? kGroupDirMode : kPrivateDirMode));
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a directory (a symlink or file is refused; check ", setting, ")"));
  }
  const uid_t me = ::geteuid();
  if (st.st_uid != me) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is owned by uid ", st.st_uid, ", not by this daemon's uid ", me,
        ": someone else created it and could swap or plant files there; remove it or choose another path (",
        setting, ")"));
  }
  const bool others_write = (st.st_mode & S_IWOTH) != 0;
  const bool group_write = (st.st_mode & S_IWGRP) != 0;
  if (others_write || (group_write && !grouped)) {
    char mode_text[8];
    std::snprintf(mode_text, sizeof(mode_text), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is writable by ", others_write ? "every user" : "its group", " (mode ", mode_text,
        "): anyone could swap or plant files there; chmod it 0700 or "
        "choose another path (",
        setting, ")"));
  }
  if (grouped && st.st_gid != group && ::chown(path.c_str(), static_cast<uid_t>(-1), group) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("chown ", path));
  }
  const mode_t mode = grouped ? (S_ISGID | kGroupDirMode) : kPrivateDirMode;
  if ((st.st_mode & 07777) != mode && ::chmod(path.c_str(), mode) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("chmod ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ProcessLock>> ProcessLock::Acquire(const std::string& path,
                                                                  absl::string_view what) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, kPrivateFileMode);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open lock ", path));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      char text[32] = {};
      const ssize_t n = ::pread(fd, text, sizeof(text) - 1, 0);
      ::close(fd);
      const std::string holder(absl::StripAsciiWhitespace(absl::string_view(text, n > 0 ? n : 0)));
      return absl::FailedPreconditionError(
          absl::StrCat(what, " is in use by another ckptd (pid ", holder.empty() ? "unknown" : holder,
                       ", holding ", path, "); stop it first, or give this daemon its own"));
    }
    if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS) {
      spdlog::warn("{}: the file system does not support flock ({}); a second daemon would not be detected",
                   path, std::string(ErrnoToStatus(err, "flock").message()));
      return std::unique_ptr<ProcessLock>(new ProcessLock(fd));
    }
    ::close(fd);
    return ErrnoToStatus(err, absl::StrCat("flock ", path));
  }
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, absl::StrCat("write lock ", path));
  }
  return std::unique_ptr<ProcessLock>(new ProcessLock(fd));
}

ProcessLock::~ProcessLock() { ::close(fd_); }

CreateModes ModesBeneath(const std::string& path, bool private_at_least) {
  const CreateModes private_modes{kPrivateDirMode, kPrivateFileMode};
  std::string at = path.empty() ? "." : path;
  struct stat st {};
  while (::stat(at.c_str(), &st) != 0) {
    if (at == "/" || at == ".") return private_at_least ? private_modes : CreateModes{};
    at = DirName(at);
  }
  const bool closed_to_others = (st.st_mode & 0007) == 0;
  if (closed_to_others && (st.st_mode & S_ISGID) != 0 && (st.st_mode & 0050) == 0050) {
    return {kGroupDirMode, kGroupFileMode};
  }
  if (closed_to_others || private_at_least) return private_modes;
  return {};
}

}  // namespace ckptd
