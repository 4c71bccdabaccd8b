#include "tests/fault/fault_file_system.h"

#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"

namespace ckptd::testing {

const char* FsOpName(FsOp op) {
  switch (op) {
    case FsOp::kOpen:
      return "open";
    case FsOp::kWrite:
      return "write";
    case FsOp::kSync:
      return "fsync";
    case FsOp::kRename:
      return "rename";
    case FsOp::kMkdir:
      return "mkdir";
    case FsOp::kDelete:
      return "delete";
    case FsOp::kList:
      return "list";
    case FsOp::kStat:
      return "stat";
    case FsOp::kRead:
      return "read";
    case FsOp::kAny:
      return "any";
  }
  return "?";
}

class FaultWritableFile : public WritableFile {
 public:
  FaultWritableFile(FaultFileSystem* fs, std::string path, std::unique_ptr<WritableFile> base)
      : fs_(fs), path_(std::move(path)), base_(std::move(base)) {}

  absl::Status Append(absl::string_view data) override {
    bool torn = false;
    absl::Status s = fs_->Check(FsOp::kWrite, path_, &torn);
    if (torn) {
      absl::string_view half = data.substr(0, data.size() / 2);
      if (base_->Append(half).ok()) {
        written_ += half.size();
        fs_->FileAppended(path_, written_);
      }
      return s;
    }
    RETURN_IF_ERROR(s);
    RETURN_IF_ERROR(base_->Append(data));
    written_ += data.size();
    fs_->FileAppended(path_, written_);
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    absl::Status s = fs_->Check(FsOp::kSync, path_);
    if (s.ok()) s = base_->Sync();
    fs_->FileSynced(path_, written_, s.ok());
    return s;
  }

  absl::Status Close() override { return base_->Close(); }

 private:
  FaultFileSystem* fs_;
  std::string path_;
  std::unique_ptr<WritableFile> base_;
  uint64_t written_ = 0;
};

class FaultRandomAccessFile : public RandomAccessFile {
 public:
  FaultRandomAccessFile(FaultFileSystem* fs, std::string path, std::unique_ptr<RandomAccessFile> base)
      : fs_(fs), path_(std::move(path)), base_(std::move(base)) {}
  absl::Status Read(uint64_t offset, size_t n, char* dst) const override {
    RETURN_IF_ERROR(fs_->Check(FsOp::kRead, path_));
    return base_->Read(offset, n, dst);
  }
  uint64_t Size() const override { return base_->Size(); }

 private:
  FaultFileSystem* fs_;
  std::string path_;
  std::unique_ptr<RandomAccessFile> base_;
};

void FaultFileSystem::Arm(const FaultSpec& spec) {
  std::lock_guard<std::mutex> lock(mu_);
  spec_ = spec;
  counts_.clear();
  fired_ = false;
}

bool FaultFileSystem::fired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fired_;
}

int FaultFileSystem::count(FsOp op) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = counts_.find(op);
  return it == counts_.end() ? 0 : it->second;
}

std::vector<std::string> FaultFileSystem::RetriedSyncs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return retried_syncs_;
}

absl::Status FaultFileSystem::Check(FsOp op, const std::string& path, bool* torn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (crashed_) return ErrnoToStatus(EIO, absl::StrCat("(crashed) ", FsOpName(op), " ", path));
  const int n = ++counts_[op];
  const int any = ++counts_[FsOp::kAny];
  const bool hit = spec_.nth > 0 && !fired_ &&
                   ((spec_.op == op && n == spec_.nth) || (spec_.op == FsOp::kAny && any == spec_.nth));
  if (!hit) return absl::OkStatus();
  fired_ = true;
  if (spec_.crash) {
    crashed_ = true;
    return ErrnoToStatus(EIO, absl::StrCat("(crashed) ", FsOpName(op), " ", path));
  }
  if (spec_.torn && torn != nullptr) *torn = true;
  return ErrnoToStatus(spec_.error, absl::StrCat("(injected) ", FsOpName(op), " ", path));
}

void FaultFileSystem::FileAppended(const std::string& path, uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  size_[path] = size;
}

void FaultFileSystem::FileSynced(const std::string& path, uint64_t size, bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  if (sync_failed_.count(path) > 0) retried_syncs_.push_back(path);
  if (ok) {
    synced_size_[path] = size;
  } else {
    sync_failed_.insert(path);
  }
}

template <typename Open>
absl::StatusOr<std::unique_ptr<WritableFile>> FaultFileSystem::OpenForWrite(const std::string& path,
                                                                            Open open) {
  RETURN_IF_ERROR(Check(FsOp::kOpen, path));
  const bool existed = base_->Exists(path);
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, open());
  {
    std::lock_guard<std::mutex> lock(mu_);
    size_[path] = 0;
    synced_size_[path] = 0;
    sync_failed_.erase(path);
    if (!existed) pending_.push_back({DirName(path), path, "", false, ""});
  }
  return std::unique_ptr<WritableFile>(new FaultWritableFile(this, path, std::move(file)));
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultFileSystem::NewWritableFile(const std::string& path) {
  return OpenForWrite(path, [&] { return base_->NewWritableFile(path); });
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultFileSystem::NewDirectWritableFile(
    const std::string& path) {
  return OpenForWrite(path, [&] { return base_->NewDirectWritableFile(path); });
}

absl::StatusOr<std::unique_ptr<RandomAccessFile>> FaultFileSystem::NewRandomAccessFile(
    const std::string& path) {
  RETURN_IF_ERROR(Check(FsOp::kOpen, path));
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, base_->NewRandomAccessFile(path));
  return std::unique_ptr<RandomAccessFile>(new FaultRandomAccessFile(this, path, std::move(file)));
}

absl::Status FaultFileSystem::SetMode(const std::string& path, uint32_t mode) {
  RETURN_IF_ERROR(Check(FsOp::kStat, path));
  return base_->SetMode(path, mode);
}

absl::StatusOr<std::vector<std::string>> FaultFileSystem::ListDir(const std::string& path) {
  RETURN_IF_ERROR(Check(FsOp::kList, path));
  return base_->ListDir(path);
}

absl::StatusOr<uint64_t> FaultFileSystem::FileSize(const std::string& path) {
  RETURN_IF_ERROR(Check(FsOp::kStat, path));
  return base_->FileSize(path);
}

bool FaultFileSystem::IsDirectory(const std::string& path) {
  return Check(FsOp::kStat, path).ok() && base_->IsDirectory(path);
}

bool FaultFileSystem::Exists(const std::string& path) {
  return Check(FsOp::kStat, path).ok() && base_->Exists(path);
}

absl::Status FaultFileSystem::CreateDir(const std::string& path, uint32_t mode) {
  RETURN_IF_ERROR(Check(FsOp::kMkdir, path));
  RETURN_IF_ERROR(base_->CreateDir(path, mode));
  std::lock_guard<std::mutex> lock(mu_);
  pending_.push_back({DirName(path), path, "", false, ""});
  return absl::OkStatus();
}

absl::Status FaultFileSystem::Rename(const std::string& from, const std::string& to) {
  RETURN_IF_ERROR(Check(FsOp::kRename, to));
  DirChange change{DirName(to), to, from, false, ""};
  if (base_->Exists(to) && !base_->IsDirectory(to)) {
    auto old = base_->ReadFileToString(to, 1 << 30);
    if (old.ok()) {
      change.replaced_file = true;
      change.replaced_contents = *old;
    }
  }
  RETURN_IF_ERROR(base_->Rename(from, to));
  std::lock_guard<std::mutex> lock(mu_);
  // The renamed file's durable bytes travel with it.
  if (synced_size_.count(from) > 0) {
    synced_size_[to] = synced_size_[from];
    size_[to] = size_[from];
    synced_size_.erase(from);
    size_.erase(from);
  }
  pending_.push_back(std::move(change));
  return absl::OkStatus();
}

absl::Status FaultFileSystem::SyncDir(const std::string& path) {
  RETURN_IF_ERROR(Check(FsOp::kSync, path));
  RETURN_IF_ERROR(base_->SyncDir(path));
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<DirChange> still;
  for (DirChange& c : pending_) {
    if (c.dir != path) still.push_back(std::move(c));
  }
  pending_ = std::move(still);
  return absl::OkStatus();
}

absl::Status FaultFileSystem::DeleteFile(const std::string& path) {
  RETURN_IF_ERROR(Check(FsOp::kDelete, path));
  return base_->DeleteFile(path);
}

absl::Status FaultFileSystem::DeleteRecursively(const std::string& path) {
  RETURN_IF_ERROR(Check(FsOp::kDelete, path));
  return base_->DeleteRecursively(path);
}

void FaultFileSystem::SimulateCrash() {
  std::lock_guard<std::mutex> lock(mu_);
  // Unsynced directory changes, newest first.
  for (auto it = pending_.rbegin(); it != pending_.rend(); ++it) {
    if (!it->renamed_from.empty()) {
      if (base_->Exists(it->created)) base_->Rename(it->created, it->renamed_from).IgnoreError();
      if (synced_size_.count(it->created) > 0) {
        synced_size_[it->renamed_from] = synced_size_[it->created];
        size_[it->renamed_from] = size_[it->created];
        synced_size_.erase(it->created);
        size_.erase(it->created);
      }
      if (it->replaced_file) {  // the old file, as it was on disk
        auto file = base_->NewWritableFile(it->created);
        if (file.ok()) {
          (*file)->Append(it->replaced_contents).IgnoreError();
          (*file)->Sync().IgnoreError();
          (*file)->Close().IgnoreError();
        }
      }
    } else {
      base_->DeleteRecursively(it->created).IgnoreError();
    }
  }
  pending_.clear();
  // Unsynced bytes of the files that remain.
  for (const auto& [path, size] : size_) {
    const uint64_t durable = synced_size_.count(path) > 0 ? synced_size_[path] : 0;
    if (durable < size && base_->Exists(path) && !base_->IsDirectory(path)) {
      ::truncate(path.c_str(), static_cast<off_t>(durable));
    }
  }
  crashed_ = false;
  spec_ = FaultSpec{};
}

}  // namespace ckptd::testing
