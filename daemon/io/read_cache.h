// ReadCache: blocks of checkpoint data files that this daemon read from storage for
// a restore, kept for a short while so that the other readers of the same bytes (the
// host's other trainers, and the other hosts' daemons asking through the peer
// channel) get them from memory: in a data-parallel restore, where every trainer
// wants the whole model, each stored byte then leaves storage once across the job.
//
// A read is served in aligned blocks (block_bytes). A block another reader is
// fetching right now is waited for, not fetched again; consecutive missing blocks of
// one read are fetched with one large read (so a large entry still reaches the disk
// as one request). A block stays for `linger` after its last use and while the
// blocks held stay within `capacity_bytes` (least recently used goes first); a
// background thread frees expired blocks, so an idle daemon holds nothing. Capacity
// 0 turns caching off: reads go straight to storage and are only counted.
//
// Paths whose contents change (a step committed again under the same number) must be
// forgotten: CachingFileSystem forgets every path under a directory it renames or
// deletes. Thread-safe; owned by main, outlives every file system built on it.
#ifndef CKPTD_DAEMON_IO_READ_CACHE_H_
#define CKPTD_DAEMON_IO_READ_CACHE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/io/file_system.h"

namespace ckptd {

// What one restore (or the daemon, in total) read: from storage through this host's
// file system, and from other hosts' daemons. Filled by the file systems the
// restore reads through; atomics because a restore reads with several threads.
struct ReadCounts {
  std::atomic<uint64_t> storage_bytes{0};
  std::atomic<uint64_t> peer_bytes{0};
};

class ReadCache {
 public:
  struct Options {
    uint64_t capacity_bytes = uint64_t{1} << 30;
    absl::Duration linger = absl::Seconds(5);
    uint64_t block_bytes = uint64_t{4} << 20;  // a multiple of 4096
    // Which files are cached and counted (data files); reads of the others (the
    // index, ckptd.json: small, and read by every daemon by design) are passed on.
    std::function<bool(const std::string& path)> data_file;
  };
  explicit ReadCache(Options options);
  ~ReadCache();
  ReadCache(const ReadCache&) = delete;
  ReadCache& operator=(const ReadCache&) = delete;

  // Bytes of a data file that one reader (a restore) is about to read.
  struct Range {
    std::string path;
    uint64_t offset = 0;
    uint64_t size = 0;
  };
  // What a reader declared it will read, for as long as the object lives: the cache
  // keeps a block for that reader's reads only where another declared reader wants
  // it too (see Read). A default-constructed one declares nothing. Movable; destroy
  // before the cache.
  class Interest {
   public:
    Interest() = default;
    Interest(Interest&& other) noexcept;
    Interest& operator=(Interest&& other) noexcept;
    ~Interest();
    uint64_t id() const { return id_; }

   private:
    friend class ReadCache;
    Interest(ReadCache* cache, uint64_t id, std::vector<std::pair<std::string, uint64_t>> blocks)
        : cache_(cache), id_(id), blocks_(std::move(blocks)) {}
    ReadCache* cache_ = nullptr;
    uint64_t id_ = 0;
    std::vector<std::pair<std::string, uint64_t>> blocks_;
  };
  Interest Declare(const std::vector<Range>& ranges);

  // Reads [offset, offset + n) of `file`, whose path is `path`, into dst, from cached
  // blocks where it can. Bytes fetched from storage are added to *counts (when not
  // null) and to the daemon's total. Errors are the file's; a failed fetch leaves
  // nothing cached.
  // With `reader` (a declared interest), a block that is neither here nor wanted by
  // another declared reader is read straight into dst and not kept: one landing in
  // memory instead of a fetch into block memory and a copy out of it (first touch
  // of memory is the slow part of a restore). Without it, every block is kept.
  absl::Status Read(const std::string& path, const RandomAccessFile& file, uint64_t offset, size_t n,
                    char* dst, ReadCounts* counts, const Interest* reader = nullptr);
  // Reads straight from `file`, counting the bytes as Read does.
  absl::Status ReadThrough(const RandomAccessFile& file, uint64_t offset, size_t n, char* dst,
                           ReadCounts* counts);
  // Drops every block of a path under `dir` (or of `dir` itself).
  void Forget(const std::string& dir);

  bool enabled() const { return options_.capacity_bytes > 0; }
  bool IsDataFile(const std::string& path) const { return !options_.data_file || options_.data_file(path); }
  // Totals since start: bytes fetched from storage for reads through the cache (and
  // read-through reads), and bytes served from blocks already held.
  uint64_t storage_bytes_read() const { return total_.storage_bytes.load(); }
  uint64_t hit_bytes() const { return hit_bytes_.load(); }
  uint64_t held_bytes() const;

 private:
  struct Block {
    explicit Block(ReadCache* owner) : owner(owner) {}
    ~Block();
    Block(const Block&) = delete;
    Block& operator=(const Block&) = delete;
    ReadCache* owner;
    char* data = nullptr;  // block_bytes of pooled memory, set by the fetch
    uint64_t length = 0;
    bool ready = false;   // fetched (or failed: then status is set and the block is gone)
    absl::Status status;  // of the fetch
    absl::Time last_use;
    bool held = false;  // ready, ok, and in the cache (then `lru` is its place)
    std::list<std::pair<std::string, uint64_t>>::iterator lru;
  };
  using Key = std::pair<std::string, uint64_t>;  // path, block index

  // Fetches `run`, blocks first, first + 1, ... of `file`, as one read (ReadV).
  void Fetch(const std::string& path, const RandomAccessFile& file, uint64_t first,
             const std::vector<std::shared_ptr<Block>>& run, ReadCounts* counts);
  // Block memory: 2 MiB-aligned and advised for huge pages (fresh memory is touched
  // far faster that way), and reused: freed blocks wait in a pool, which the
  // sweeper empties once nothing is held.
  char* AcquireBuffer();
  void ReleaseBuffer(char* buffer);
  void EvictLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropLocked(std::map<Key, std::shared_ptr<Block>>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Sweep();
  void Withdraw(const Interest& interest);
  // Whether a declared reader other than `reader` wants block `key`.
  bool WantedByOtherLocked(const Key& key, uint64_t reader) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  ReadCounts total_;
  std::atomic<uint64_t> hit_bytes_{0};
  mutable absl::Mutex mu_;
  std::map<Key, std::shared_ptr<Block>> blocks_ ABSL_GUARDED_BY(mu_);
  std::list<Key> lru_ ABSL_GUARDED_BY(mu_);  // ready blocks, least recently used first
  // Blocks declared readers want, with their ids (one entry per reader).
  std::map<Key, std::vector<uint64_t>> wanted_ ABSL_GUARDED_BY(mu_);
  uint64_t next_interest_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t held_ ABSL_GUARDED_BY(mu_) = 0;  // bytes of ready blocks
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex pool_mu_;
  std::vector<char*> pool_ ABSL_GUARDED_BY(pool_mu_);
  std::thread sweeper_;
};

// A FileSystem over `target` whose renames and deletions make `cache` forget what
// they touch, and whose reads are, per `reads`: kCached, through the cache, counted
// into `counts` (may be null) and the cache's total (with `reader`, the declared
// interest of the restore reading, the cache keeps only blocks another reader wants);
// kCounted, straight from the target but counted so (a directory the cache does not
// follow, like the drain); kPassedOn, neither (the commit's own reads, which are not
// restores). Files it opens refer to the cache (and `reader`), which must outlive them.
class CachingFileSystem final : public FileSystemWrapper {
 public:
  enum class Reads { kCached, kCounted, kPassedOn };
  CachingFileSystem(FileSystem* target, ReadCache* cache, Reads reads, ReadCounts* counts = nullptr,
                    const ReadCache::Interest* reader = nullptr)
      : FileSystemWrapper(target), cache_(cache), reads_(reads), counts_(counts), reader_(reader) {}
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status DeleteFile(const std::string& path) override;
  absl::Status DeleteRecursively(const std::string& path) override;

 private:
  ReadCache* cache_;
  Reads reads_;
  ReadCounts* counts_;
  const ReadCache::Interest* reader_;
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_IO_READ_CACHE_H_
