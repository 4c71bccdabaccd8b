// FaultFileSystem: a FileSystem for tests that wraps a real one (FileSystemWrapper) and
// (1) fails the Nth open (buffered, O_DIRECT or for reading) / write / sync / rename /
// mkdir / delete / list / stat / read with an errno, (2) tears a write short, (3)
// "crashes" at the Nth operation: that one and all later ones fail, and
// SimulateCrash() then rolls the real directory back to what a crash would leave, the
// LevelDB/RocksDB model: bytes written since a file's last Sync are dropped, and
// entries created or renamed in a directory since its last SyncDir are undone.
// Deletions are treated as immediately durable (a simplification). It also records
// any Sync retried on a file whose Sync failed. Thread-safe.
#ifndef CKPTD_TESTS_FAULT_FAULT_FILE_SYSTEM_H_
#define CKPTD_TESTS_FAULT_FAULT_FILE_SYSTEM_H_

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "daemon/io/file_system.h"

namespace ckptd::testing {

// kStat covers FileSize, SetMode, Exists and IsDirectory (a failed Exists or
// IsDirectory answers false, as a failing stat would); kRead a RandomAccessFile read.
enum class FsOp { kOpen, kWrite, kSync, kRename, kMkdir, kDelete, kList, kStat, kRead, kAny };
const char* FsOpName(FsOp op);

struct FaultSpec {
  FsOp op = FsOp::kAny;
  int nth = 0;         // 1-based count of `op` operations after Arm; 0 = never
  int error = 0;       // errno to return
  bool torn = false;   // a write: half the bytes land, then the error
  bool crash = false;  // this op and every later one fail with EIO
};

class FaultFileSystem : public FileSystemWrapper {
 public:
  explicit FaultFileSystem(FileSystem* base) : FileSystemWrapper(base), base_(base) {}

  void Arm(const FaultSpec& spec);
  bool fired() const;
  int count(FsOp op) const;
  // Fsyncs retried on a file after its fsync failed (must stay empty).
  std::vector<std::string> RetriedSyncs() const;
  // Rolls the real files back to what survives a crash at the fault point.
  void SimulateCrash();

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> NewDirectWritableFile(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override;
  absl::Status CreateDir(const std::string& path, uint32_t mode) override;
  absl::Status SetMode(const std::string& path, uint32_t mode) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status SyncDir(const std::string& path) override;
  absl::Status DeleteFile(const std::string& path) override;
  absl::Status DeleteRecursively(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override;
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override;
  bool IsDirectory(const std::string& path) override;
  bool Exists(const std::string& path) override;

 private:
  friend class FaultWritableFile;
  friend class FaultRandomAccessFile;
  // Opens through `open` (buffered or O_DIRECT) with the bookkeeping of a new file.
  template <typename Open>
  absl::StatusOr<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path, Open open);
  // OK, or the injected error for this operation. `torn` is set for a torn write.
  absl::Status Check(FsOp op, const std::string& path, bool* torn = nullptr);
  void FileAppended(const std::string& path, uint64_t size);
  void FileSynced(const std::string& path, uint64_t size, bool ok);

  // An undoable directory change, pending until its directory is synced.
  struct DirChange {
    std::string dir;
    std::string created;            // path of a new file or directory
    std::string renamed_from;       // with created: the rename's source
    bool replaced_file = false;     // the rename replaced an existing file...
    std::string replaced_contents;  // ...whose contents were these
  };

  FileSystem* base_;
  mutable std::mutex mu_;
  FaultSpec spec_;
  std::map<FsOp, int> counts_;
  bool fired_ = false;
  bool crashed_ = false;
  std::map<std::string, uint64_t> size_;         // bytes written, per file
  std::map<std::string, uint64_t> synced_size_;  // bytes durable, per file
  std::set<std::string> sync_failed_;
  std::vector<std::string> retried_syncs_;
  std::vector<DirChange> pending_;
};

}  // namespace ckptd::testing

#endif  // CKPTD_TESTS_FAULT_FAULT_FILE_SYSTEM_H_
