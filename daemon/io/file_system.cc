#include "daemon/io/file_system.h"

#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"

namespace ckptd {

std::string JoinPath(absl::string_view a, absl::string_view b) {
  if (a.empty()) return std::string(b);
  if (a.back() == '/') return absl::StrCat(a, b);
  return absl::StrCat(a, "/", b);
}

std::string DirName(absl::string_view path) {
  size_t slash = path.rfind('/');
  if (slash == absl::string_view::npos) return ".";
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

absl::Status FileSystem::CreateDirs(const std::string& path, uint32_t mode) {
  if (path.empty() || IsDirectory(path)) return absl::OkStatus();
  std::string parent = DirName(path);
  if (parent != path) RETURN_IF_ERROR(CreateDirs(parent, mode));
  absl::Status s = CreateDir(path, mode);
  if (absl::IsAlreadyExists(s) && IsDirectory(path)) return absl::OkStatus();
  return s;
}

absl::StatusOr<std::string> FileSystem::ReadFileToString(const std::string& path, uint64_t max_bytes) {
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, NewRandomAccessFile(path));
  if (file->Size() > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(path, " is ", file->Size(), " bytes, more than the limit of ", max_bytes));
  }
  std::string contents(file->Size(), '\0');
  RETURN_IF_ERROR(file->Read(0, contents.size(), contents.data()));
  return contents;
}

absl::Status FileSystem::WriteFileAtomically(const std::string& path, absl::string_view contents) {
  const std::string tmp = path + ".tmp";
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, NewWritableFile(tmp));
  absl::Status s = file->Append(contents);
  if (s.ok()) s = file->Sync();
  if (s.ok()) s = file->Close();
  if (s.ok()) s = Rename(tmp, path);
  if (!s.ok()) {
    DeleteFile(tmp).IgnoreError();
    return s;
  }
  return SyncDir(DirName(path));
}

}  // namespace ckptd
