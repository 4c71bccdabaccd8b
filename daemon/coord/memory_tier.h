// MemoryTier (config memory_steps): this daemon's own data files of the last M
// committed steps, kept in staging memory, so that a restore after the trainers
// restart (the daemons still running) reads them at memory speed instead of from disk.
//
// The coordinator hands over, after a commit, the staged buffers its data file was
// written from (no copy; bytes that lived in a trainer's shared-memory segment are
// copied first, since the trainer reuses its segment). They stay accounted in the
// staging budget, and a Save that needs their room evicts the oldest kept step first
// (StagingArea::SetReclaimer), so keeping steps never blocks a save. Restores and
// peers read through MemoryTierFileSystem, which answers reads of a kept data file
// from memory and passes everything else on.
//
// Thread-safe: the coordinator keeps and forgets steps; restores, peers and the
// staging area's reclaimer read or evict from any thread. A file open for reading
// keeps its bytes alive after an eviction until it is closed.
#ifndef CKPTD_DAEMON_COORD_MEMORY_TIER_H_
#define CKPTD_DAEMON_COORD_MEMORY_TIER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/coord/commit_observer.h"
#include "daemon/coord/step_registry.h"
#include "daemon/io/file_system.h"
#include "daemon/staging/staging_area.h"

namespace ckptd {

class MemoryTier {
 public:
  explicit MemoryTier(int max_steps) : max_steps_(max_steps) {}

  // One written entry: its bytes at `offset` in the file. Gaps between entries are
  // zero padding.
  struct Piece {
    uint64_t offset = 0;
    StagedBuffer bytes{};
  };
  // Keeps `pieces` as the contents of the data file at `path` (as the store names
  // it), `size` bytes, of committed step `key`; forgets the oldest step beyond
  // max_steps. The caller vouches that the pieces hold what the file holds (the
  // daemon's own buffers the file was written from, or copies checked against the
  // file's checksums): restores copy them out without checking again.
  void Keep(const StepKey& key, const std::string& path, uint64_t size, std::vector<Piece> pieces);
  void Forget(const StepKey& key);
  // `into` holding a copy of `from`, an entry the data file stores with checksum
  // `masked_crc` (see EntryChecksum), copied and checked in one pass; DATA_LOSS when
  // the copy's checksum differs (the bytes changed after the file was written).
  static absl::StatusOr<StagedBuffer> CheckedCopy(const StagedBuffer& from, StagedBuffer into, int dtype,
                                                  int64_t elements, uint32_t masked_crc);
  // Frees the oldest kept step; false when none is kept.
  bool EvictOldest();
  // A kept file, read from memory; null when `path` is not kept.
  std::unique_ptr<RandomAccessFile> Open(const std::string& path) const;

  struct Held {
    StepKey key{};
    int64_t bytes = 0;
  };
  std::vector<Held> Steps() const;  // oldest first
  int max_steps() const { return max_steps_; }

 private:
  struct File;
  const int max_steps_;
  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<const File>> files_ ABSL_GUARDED_BY(mu_);  // oldest first
};

// Reads kept data files from the tier, everything else from `target`.
class MemoryTierFileSystem final : public FileSystemWrapper {
 public:
  MemoryTierFileSystem(FileSystem* target, const MemoryTier* tier) : FileSystemWrapper(target), tier_(tier) {}
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override;

 private:
  const MemoryTier* tier_;
};

// Keeps each committed step's data file in `tier`: takes the buffers the file was
// written from (copies of bytes that lived in a trainer's shared memory, which the
// trainer reuses once the step commits, from `staging`), hands them to the tier once
// the step commits, and forgets the steps retention removes. Coordinator thread only.
class MemoryTierObserver final : public CommitObserver {
 public:
  MemoryTierObserver(MemoryTier* tier, StagingArea* staging) : tier_(tier), staging_(staging) {}
  bool TakesWrittenBuffers() const override { return true; }
  void OnWritten(const StepKey& key, absl::Span<const WrittenBox> boxes) override;
  void OnConcluded(const StepOutcome& outcome) override;
  void OnRemoved(const std::string& run, const std::vector<int64_t>& steps) override;

 private:
  MemoryTier* tier_;
  StagingArea* staging_;
  std::map<StepKey, std::vector<MemoryTier::Piece>> written_;  // until the step concludes
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_COORD_MEMORY_TIER_H_
