#include "daemon/coord/memory_tier.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/base/dtype.h"
#include "daemon/bundle/bundle.h"
#include "daemon/bundle/crc32c.h"

namespace ckptd {

struct MemoryTier::File {
  StepKey key;
  std::string path;
  uint64_t size = 0;
  std::vector<Piece> pieces;  // by offset
};

namespace {

class MemoryFile final : public RandomAccessFile {
 public:
  MemoryFile(std::shared_ptr<const void> keep, const std::vector<MemoryTier::Piece>* pieces, uint64_t size)
      : keep_(std::move(keep)), pieces_(pieces), size_(size) {}

  absl::Status Read(uint64_t offset, size_t n, char* dst) const override {
    if (offset > size_ || n > size_ - offset) {
      return absl::OutOfRangeError(
          absl::StrCat("read of ", n, " bytes at ", offset, " past the end (", size_, ")"));
    }
    const uint64_t end = offset + n;
    // The first piece that ends after `offset`.
    auto it = std::upper_bound(pieces_->begin(), pieces_->end(), offset,
                               [](uint64_t off, const MemoryTier::Piece& p) {
                                 return off < p.offset + static_cast<uint64_t>(p.bytes.size());
                               });
    uint64_t at = offset;  // bytes before `at` are filled
    for (; it != pieces_->end() && it->offset < end; ++it) {
      const uint64_t from = std::max(offset, it->offset);
      const uint64_t to = std::min(end, it->offset + static_cast<uint64_t>(it->bytes.size()));
      std::memset(dst + (at - offset), 0, from - at);  // padding between entries reads as zeros
      std::memcpy(dst + (from - offset), it->bytes.data() + (from - it->offset), to - from);
      at = to;
    }
    std::memset(dst + (at - offset), 0, end - at);
    return absl::OkStatus();
  }
  uint64_t Size() const override { return size_; }
  // Kept bytes were checked against the data file's checksums when they were kept
  // (MemoryTier::Keep's contract) and only this daemon can write them.
  const char* InMemory(uint64_t offset, size_t n) const override {
    if (offset > size_ || n > size_ - offset) return nullptr;
    auto it = std::upper_bound(pieces_->begin(), pieces_->end(), offset,
                               [](uint64_t off, const MemoryTier::Piece& p) { return off < p.offset; });
    if (it == pieces_->begin()) return nullptr;
    --it;  // the last piece that starts at or before `offset`
    if (offset + n > it->offset + static_cast<uint64_t>(it->bytes.size())) return nullptr;
    return it->bytes.data() + (offset - it->offset);
  }

 private:
  std::shared_ptr<const void> keep_;
  const std::vector<MemoryTier::Piece>* pieces_;
  uint64_t size_;
};

}  // namespace

absl::StatusOr<StagedBuffer> MemoryTier::CheckedCopy(const StagedBuffer& from, StagedBuffer into, int dtype,
                                                     int64_t elements, uint32_t masked_crc) {
  const size_t n = static_cast<size_t>(from.size());
  if (into.size() != from.size()) {
    return absl::InternalError(absl::StrCat("CheckedCopy: ", from.size(), " bytes into ", into.size()));
  }
  absl::StatusOr<uint32_t> crc;
  if (dtype == kString) {
    std::memcpy(into.data(), from.data(), n);
    crc = EntryChecksum(dtype, elements, into.data(), n);
  } else {
    crc = crc32c::Mask(crc32c::CopyAndExtend(0, into.data(), from.data(), n));
  }
  if (!crc.ok()) return crc.status();
  if (*crc != masked_crc) {
    return absl::DataLossError(
        "its bytes in the trainer's shared memory changed after the data file was written (a trainer must "
        "not write into a segment before its step commits)");
  }
  return into;
}

void MemoryTier::Keep(const StepKey& key, const std::string& path, uint64_t size, std::vector<Piece> pieces) {
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
  auto file =
      std::make_shared<File>(File{.key = key, .path = path, .size = size, .pieces = std::move(pieces)});
  std::deque<std::shared_ptr<const File>> dropped;  // freed outside the lock
  absl::MutexLock lock(&mu_);
  for (auto it = files_.begin(); it != files_.end();) {
    if ((*it)->key == key) {
      dropped.push_back(std::move(*it));
      it = files_.erase(it);
    } else {
      ++it;
    }
  }
  files_.push_back(std::move(file));
  while (static_cast<int>(files_.size()) > max_steps_) {
    dropped.push_back(std::move(files_.front()));
    files_.pop_front();
  }
}

void MemoryTier::Forget(const StepKey& key) {
  std::shared_ptr<const File> dropped;
  absl::MutexLock lock(&mu_);
  for (auto it = files_.begin(); it != files_.end(); ++it) {
    if ((*it)->key == key) {
      dropped = std::move(*it);
      files_.erase(it);
      return;
    }
  }
}

bool MemoryTier::EvictOldest() {
  std::shared_ptr<const File> dropped;
  {
    absl::MutexLock lock(&mu_);
    if (files_.empty()) return false;
    dropped = std::move(files_.front());
    files_.pop_front();
  }
  return true;  // `dropped` frees the buffers here, outside the lock
}

std::unique_ptr<RandomAccessFile> MemoryTier::Open(const std::string& path) const {
  absl::MutexLock lock(&mu_);
  for (const auto& file : files_) {
    if (file->path == path) return std::make_unique<MemoryFile>(file, &file->pieces, file->size);
  }
  return nullptr;
}

std::vector<MemoryTier::Held> MemoryTier::Steps() const {
  std::vector<Held> held;
  absl::MutexLock lock(&mu_);
  for (const auto& file : files_)
    held.push_back({.key = file->key, .bytes = static_cast<int64_t>(file->size)});
  return held;
}

absl::StatusOr<std::unique_ptr<RandomAccessFile>> MemoryTierFileSystem::NewRandomAccessFile(
    const std::string& path) {
  if (std::unique_ptr<RandomAccessFile> kept = tier_->Open(path); kept != nullptr) return kept;
  return target()->NewRandomAccessFile(path);
}

void MemoryTierObserver::OnWritten(const StepKey& key, absl::Span<const WrittenBox> boxes) {
  // Bytes in a trainer's shared memory are copied: the trainer reuses its segment
  // once the step commits. Each copy is checked against the checksum the file was
  // written with (a trainer that wrote into its segment too early would otherwise
  // leave the tier holding other bytes than the file), so that restores from the
  // tier need not check again. A copy that finds no room in staging memory, or
  // other bytes, leaves the step out of the tier (saves always come first).
  std::vector<MemoryTier::Piece>& kept = written_[key];
  kept.clear();
  for (const WrittenBox& box : boxes) {
    StagedBuffer& bytes = *box.bytes;
    if (bytes.borrowed()) {
      absl::StatusOr<StagedBuffer> copy = staging_->Allocate(bytes.size());
      if (copy.ok())
        copy = MemoryTier::CheckedCopy(bytes, *std::move(copy), box.dtype, box.elements, box.crc32c);
      if (!copy.ok()) {
        spdlog::log(absl::IsDataLoss(copy.status()) ? spdlog::level::warn : spdlog::level::debug,
                    "run '{}' step {} not kept in memory: '{}' {}", key.run, key.step, box.tensor,
                    std::string(copy.status().message()));
        written_.erase(key);
        return;
      }
      bytes = *std::move(copy);
    }
    kept.push_back({.offset = box.offset, .bytes = std::move(bytes)});
  }
}

void MemoryTierObserver::OnConcluded(const StepOutcome& outcome) {
  auto it = written_.find(outcome.key);
  if (it == written_.end()) return;
  if (outcome.status.ok() && !it->second.empty()) {
    tier_->Keep(outcome.key, outcome.data_file, static_cast<uint64_t>(outcome.bytes_written),
                std::move(it->second));
  }
  written_.erase(it);
}

void MemoryTierObserver::OnRemoved(const std::string& run, const std::vector<int64_t>& steps) {
  for (int64_t step : steps) tier_->Forget({run, step});
}

}  // namespace ckptd
