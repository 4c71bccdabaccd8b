#include "daemon/io/read_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"

namespace ckptd {

ReadCache::Block::~Block() {
  if (data != nullptr) owner->ReleaseBuffer(data);
}

char* ReadCache::AcquireBuffer() {
  {
    absl::MutexLock lock(&pool_mu_);
    if (!pool_.empty()) {
      char* buffer = pool_.back();
      pool_.pop_back();
      return buffer;
    }
  }
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t bytes = (options_.block_bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* buffer = std::aligned_alloc(kHugePage, bytes);
  if (buffer != nullptr) ::madvise(buffer, bytes, MADV_HUGEPAGE);  // a hint; fine if refused
  return static_cast<char*>(buffer);
}

void ReadCache::ReleaseBuffer(char* buffer) {
  absl::MutexLock lock(&pool_mu_);
  if ((pool_.size() + 1) * options_.block_bytes > options_.capacity_bytes) {
    std::free(buffer);
    return;
  }
  pool_.push_back(buffer);
}

namespace {

bool Under(const std::string& path, const std::string& dir) {
  return path == dir || (absl::StartsWith(path, dir) && path.size() > dir.size() && path[dir.size()] == '/');
}

class CachedFile final : public RandomAccessFile {
 public:
  CachedFile(std::unique_ptr<RandomAccessFile> file, std::string path, ReadCache* cache, bool cached,
             ReadCounts* counts, const ReadCache::Interest* reader)
      : file_(std::move(file)),
        path_(std::move(path)),
        cache_(cache),
        cached_(cached),
        counts_(counts),
        reader_(reader) {}
  absl::Status Read(uint64_t offset, size_t n, char* dst) const override {
    return cached_ ? cache_->Read(path_, *file_, offset, n, dst, counts_, reader_)
                   : cache_->ReadThrough(*file_, offset, n, dst, counts_);
  }
  uint64_t Size() const override { return file_->Size(); }

 private:
  std::unique_ptr<RandomAccessFile> file_;
  std::string path_;
  ReadCache* cache_;
  bool cached_;
  ReadCounts* counts_;
  const ReadCache::Interest* reader_;
};

void Count(ReadCounts* counts, ReadCounts& total, uint64_t bytes) {
  total.storage_bytes += bytes;
  if (counts != nullptr) counts->storage_bytes += bytes;
}

}  // namespace

ReadCache::ReadCache(Options options) : options_(std::move(options)) {
  if (!enabled()) return;
  sweeper_ = std::thread([this] { Sweep(); });
}

ReadCache::~ReadCache() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (sweeper_.joinable()) sweeper_.join();
  {
    absl::MutexLock lock(&mu_);
    lru_.clear();
    blocks_.clear();
  }
  absl::MutexLock lock(&pool_mu_);
  for (char* buffer : pool_) std::free(buffer);
  pool_.clear();
}

uint64_t ReadCache::held_bytes() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

void ReadCache::Sweep() {
  // Expired blocks are freed even when no read comes to push them out: an idle
  // daemon gives its memory back within about a linger.
  const absl::Duration period = std::clamp(options_.linger / 2, absl::Milliseconds(10), absl::Seconds(1));
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), period);
    EvictLocked(absl::Now());
    if (!lru_.empty()) continue;
    std::vector<char*> idle;
    {
      absl::MutexLock pool_lock(&pool_mu_);
      idle.swap(pool_);
    }
    for (char* buffer : idle) std::free(buffer);
  }
}

void ReadCache::DropLocked(std::map<Key, std::shared_ptr<Block>>::iterator it) {
  Block& block = *it->second;
  if (block.held) {
    lru_.erase(block.lru);
    held_ -= block.length;
    block.held = false;
  }
  blocks_.erase(it);
}

void ReadCache::EvictLocked(absl::Time now) {
  while (!lru_.empty()) {
    auto it = blocks_.find(lru_.front());
    if (held_ <= options_.capacity_bytes && it->second->last_use + options_.linger > now) break;
    DropLocked(it);
  }
}

void ReadCache::Forget(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  for (auto it = blocks_.lower_bound({dir, 0});
       it != blocks_.end() && absl::StartsWith(it->first.first, dir);) {
    if (Under(it->first.first, dir)) {
      auto next = std::next(it);
      DropLocked(it);
      it = next;
    } else {
      ++it;
    }
  }
}

void ReadCache::Fetch(const std::string& path, const RandomAccessFile& file, uint64_t first,
                      const std::vector<std::shared_ptr<Block>>& run, ReadCounts* counts) {
  const uint64_t start = first * options_.block_bytes;
  uint64_t bytes = 0;
  absl::Status fetched;
  std::vector<absl::Span<char>> pieces;
  for (const std::shared_ptr<Block>& block : run) {
    // Not yet ready: no reader looks at `data` until `ready` is set under mu_.
    block->data = AcquireBuffer();
    if (block->data == nullptr)
      fetched = absl::ResourceExhaustedError(absl::StrCat("no memory to read ", path));
    pieces.emplace_back(block->data, block->length);
    bytes += block->length;
  }
  if (fetched.ok()) fetched = file.ReadV(start, pieces);
  if (fetched.ok()) Count(counts, total_, bytes);
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < run.size(); ++i) {
    Block& block = *run[i];
    block.status = fetched;
    block.ready = true;
    block.last_use = now;
    auto it = blocks_.find({path, first + i});
    if (it == blocks_.end() || it->second != run[i]) continue;  // forgotten meanwhile
    if (!fetched.ok()) {
      blocks_.erase(it);  // the next reader tries storage again
      continue;
    }
    lru_.push_back(it->first);
    block.lru = std::prev(lru_.end());
    block.held = true;
    held_ += block.length;
  }
  EvictLocked(now);
}

absl::Status ReadCache::ReadThrough(const RandomAccessFile& file, uint64_t offset, size_t n, char* dst,
                                    ReadCounts* counts) {
  absl::Status s = file.Read(offset, n, dst);
  if (s.ok()) Count(counts, total_, n);
  return s;
}

ReadCache::Interest::Interest(Interest&& other) noexcept
    : cache_(std::exchange(other.cache_, nullptr)), id_(other.id_), blocks_(std::move(other.blocks_)) {}

ReadCache::Interest& ReadCache::Interest::operator=(Interest&& other) noexcept {
  if (this != &other) {
    if (cache_ != nullptr) cache_->Withdraw(*this);
    cache_ = std::exchange(other.cache_, nullptr);
    id_ = other.id_;
    blocks_ = std::move(other.blocks_);
  }
  return *this;
}

ReadCache::Interest::~Interest() {
  if (cache_ != nullptr) cache_->Withdraw(*this);
}

ReadCache::Interest ReadCache::Declare(const std::vector<Range>& ranges) {
  std::set<Key> keys;
  for (const Range& range : ranges) {
    if (range.size == 0) continue;
    for (uint64_t b = range.offset / options_.block_bytes;
         b <= (range.offset + range.size - 1) / options_.block_bytes; ++b) {
      keys.insert({range.path, b});
    }
  }
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_interest_++;
  for (const Key& key : keys) wanted_[key].push_back(id);
  return Interest(this, id, {keys.begin(), keys.end()});
}

void ReadCache::Withdraw(const Interest& interest) {
  absl::MutexLock lock(&mu_);
  for (const Key& key : interest.blocks_) {
    auto it = wanted_.find(key);
    if (it == wanted_.end()) continue;
    std::erase(it->second, interest.id_);
    if (it->second.empty()) wanted_.erase(it);
  }
}

bool ReadCache::WantedByOtherLocked(const Key& key, uint64_t reader) const {
  auto it = wanted_.find(key);
  return it != wanted_.end() && absl::c_any_of(it->second, [reader](uint64_t id) { return id != reader; });
}

absl::Status ReadCache::Read(const std::string& path, const RandomAccessFile& file, uint64_t offset, size_t n,
                             char* dst, ReadCounts* counts, const Interest* reader) {
  if (n == 0 || !enabled() || offset > file.Size() || n > file.Size() - offset) {
    return ReadThrough(file, offset, n, dst, counts);  // (or its range error)
  }
  const uint64_t block_bytes = options_.block_bytes;
  const uint64_t first = offset / block_bytes;
  const uint64_t last = (offset + n - 1) / block_bytes;
  std::vector<std::shared_ptr<Block>> blocks;  // null: read straight into dst
  std::vector<bool> mine;                      // blocks this call fetches
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t b = first; b <= last; ++b) {
      const Key key(path, b);
      auto it = blocks_.find(key);
      if (it == blocks_.end() && reader != nullptr && !WantedByOtherLocked(key, reader->id())) {
        blocks.push_back(nullptr);
        mine.push_back(false);
        continue;
      }
      const bool added = it == blocks_.end();
      if (added) {
        it = blocks_.emplace(key, std::make_shared<Block>(this)).first;
        it->second->length = std::min((b + 1) * block_bytes, file.Size()) - b * block_bytes;
      }
      blocks.push_back(it->second);
      mine.push_back(added);
    }
  }
  // Runs of consecutive blocks nobody holds: one storage read each, into block
  // memory, or straight into dst where nobody else wants them.
  for (size_t i = 0; i < blocks.size();) {
    const bool direct = blocks[i] == nullptr;
    if (!direct && !mine[i]) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < blocks.size() && (direct ? blocks[j] == nullptr : mine[j])) ++j;  // (mine: not null)
    if (direct) {
      const uint64_t from = std::max((first + i) * block_bytes, offset);
      const uint64_t to = std::min((first + j) * block_bytes, offset + n);
      RETURN_IF_ERROR(ReadThrough(file, from, to - from, dst + (from - offset), counts));
    } else {
      Fetch(path, file, first + i, {blocks.begin() + i, blocks.begin() + j}, counts);
    }
    i = j;
  }
  uint64_t hits = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i] == nullptr) continue;
    Block& block = *blocks[i];
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&block.ready));
      if (!block.status.ok()) return block.status;
      if (block.held) {
        block.last_use = absl::Now();
        lru_.splice(lru_.end(), lru_, block.lru);
      }
    }
    const uint64_t block_start = (first + i) * block_bytes;
    const uint64_t from = std::max(block_start, offset);
    const uint64_t to = std::min(block_start + block.length, offset + n);
    std::memcpy(dst + (from - offset), block.data + (from - block_start), to - from);
    if (!mine[i]) hits += to - from;
  }
  hit_bytes_ += hits;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RandomAccessFile>> CachingFileSystem::NewRandomAccessFile(
    const std::string& path) {
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> file = target()->NewRandomAccessFile(path);
  if (!file.ok() || reads_ == Reads::kPassedOn || !cache_->IsDataFile(path)) return file;
  return std::make_unique<CachedFile>(*std::move(file), path, cache_, reads_ == Reads::kCached, counts_,
                                      reader_);
}

absl::Status CachingFileSystem::Rename(const std::string& from, const std::string& to) {
  cache_->Forget(from);
  cache_->Forget(to);
  absl::Status s = target()->Rename(from, to);
  cache_->Forget(to);  // a reader may have cached the old `to` while the rename ran
  return s;
}

absl::Status CachingFileSystem::DeleteFile(const std::string& path) {
  absl::Status s = target()->DeleteFile(path);
  cache_->Forget(path);
  return s;
}

absl::Status CachingFileSystem::DeleteRecursively(const std::string& path) {
  absl::Status s = target()->DeleteRecursively(path);
  cache_->Forget(path);
  return s;
}

}  // namespace ckptd
