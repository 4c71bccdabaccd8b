#include "daemon/io/read_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "tests/common/temp_dir.h"

namespace ckptd {
namespace {

constexpr uint64_t kBlock = 4096;

// A file in memory that counts what is read from it; optionally its first read
// announces itself and waits for a gate, and the first `failures` reads fail.
class CountingFile final : public RandomAccessFile {
 public:
  explicit CountingFile(std::string data) : data_(std::move(data)) {}
  absl::Status Read(uint64_t offset, size_t n, char* dst) const override {
    return ReadV(offset, {absl::Span<char>(dst, n)});
  }
  // One storage request however many pieces.
  absl::Status ReadV(uint64_t offset, const std::vector<absl::Span<char>>& pieces) const override {
    size_t n = 0;
    for (const absl::Span<char>& piece : pieces) n += piece.size();
    if (offset + n > data_.size()) return absl::OutOfRangeError("past the end");
    if (reads_++ == 0 && gate_ != nullptr) {
      entered_.Notify();
      gate_->WaitForNotification();
    }
    if (failures_ > 0) {
      --failures_;
      return absl::DataLossError("injected");
    }
    bytes_ += n;
    for (const absl::Span<char>& piece : pieces) {
      data_.copy(piece.data(), piece.size(), offset);
      offset += piece.size();
    }
    return absl::OkStatus();
  }
  uint64_t Size() const override { return data_.size(); }

  std::string data_;
  mutable std::atomic<int> reads_{0};
  mutable std::atomic<uint64_t> bytes_{0};
  mutable std::atomic<int> failures_{0};
  absl::Notification* gate_ = nullptr;
  mutable absl::Notification entered_;
};

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 7 + i / 4096);
  return s;
}

constexpr char kPath[] = "/r/run/step-1/ckpt.data-00000-of-00001";

std::string Read(ReadCache& cache, const CountingFile& file, uint64_t offset, size_t n,
                 ReadCounts* counts = nullptr, const ReadCache::Interest* reader = nullptr) {
  std::string out(n, 'x');
  const absl::Status s = cache.Read(kPath, file, offset, n, out.data(), counts, reader);
  return s.ok() ? out : s.ToString();
}

ReadCache::Options Small(uint64_t capacity_blocks) {
  return {.capacity_bytes = capacity_blocks * kBlock,
          .linger = absl::Hours(1),
          .block_bytes = kBlock,
          .data_file = {}};
}

TEST(ReadCacheTest, BytesReadOnceAreServedFromMemoryToTheNextReaderAndCountedOnce) {
  ReadCache cache(Small(16));
  const CountingFile file(Pattern(10 * kBlock + 100));
  ReadCounts first, second;
  // Spans blocks 1-3: fetched as one storage read of whole blocks.
  EXPECT_EQ(Read(cache, file, kBlock + 5, 2 * kBlock, &first), file.data_.substr(kBlock + 5, 2 * kBlock));
  EXPECT_EQ(file.reads_, 1);
  EXPECT_EQ(first.storage_bytes, 3 * kBlock);
  // Another reader of part of those bytes plus the file's short last block.
  EXPECT_EQ(Read(cache, file, 2 * kBlock, kBlock, &second), file.data_.substr(2 * kBlock, kBlock));
  EXPECT_EQ(second.storage_bytes, 0u);
  EXPECT_EQ(Read(cache, file, 9 * kBlock, kBlock + 100, &second), file.data_.substr(9 * kBlock));
  EXPECT_EQ(second.storage_bytes, kBlock + 100);
  EXPECT_EQ(file.bytes_, 4 * kBlock + 100);
  EXPECT_EQ(cache.storage_bytes_read(), 4 * kBlock + 100);
  EXPECT_EQ(cache.hit_bytes(), kBlock);
  EXPECT_EQ(cache.held_bytes(), 4 * kBlock + 100);
  // Past the end: the file's own error, nothing cached.
  EXPECT_NE(Read(cache, file, 10 * kBlock, 200).find("OUT_OF_RANGE"), std::string::npos);
}

TEST(ReadCacheTest, AReaderArrivingWhileABlockIsFetchedWaitsForItInsteadOfReadingStorage) {
  ReadCache cache(Small(16));
  CountingFile file(Pattern(4 * kBlock));
  absl::Notification gate;
  file.gate_ = &gate;
  std::string a, b;
  std::thread first([&] { a = Read(cache, file, 0, 4 * kBlock); });
  file.entered_.WaitForNotification();  // the first fetch is in storage now
  std::thread second([&] { b = Read(cache, file, kBlock, 2 * kBlock); });
  gate.Notify();
  first.join();
  second.join();
  EXPECT_EQ(a, file.data_);
  EXPECT_EQ(b, file.data_.substr(kBlock, 2 * kBlock));
  EXPECT_EQ(file.reads_, 1);
  EXPECT_EQ(cache.storage_bytes_read(), 4 * kBlock);
}

TEST(ReadCacheTest, AFailedFetchCachesNothingAndTheNextReadTriesStorageAgain) {
  ReadCache cache(Small(16));
  CountingFile file(Pattern(2 * kBlock));
  file.failures_ = 1;
  EXPECT_NE(Read(cache, file, 0, kBlock).find("DATA_LOSS"), std::string::npos);
  EXPECT_EQ(cache.held_bytes(), 0u);
  EXPECT_EQ(Read(cache, file, 0, kBlock), file.data_.substr(0, kBlock));
  EXPECT_EQ(file.reads_, 2);
}

TEST(ReadCacheTest, AReaderNobodyElseWantsReadsStraightIntoItsMemoryAndKeepsNothing) {
  ReadCache cache(Small(16));
  const CountingFile file(Pattern(8 * kBlock));
  const ReadCache::Interest alone = cache.Declare({{kPath, 100, 6 * kBlock}});
  ReadCounts counts;
  // Only the bytes asked for leave storage (no whole blocks), and none are kept.
  EXPECT_EQ(Read(cache, file, 100, 6 * kBlock, &counts, &alone), file.data_.substr(100, 6 * kBlock));
  EXPECT_EQ(counts.storage_bytes, 6 * kBlock);
  EXPECT_EQ(cache.held_bytes(), 0u);
  EXPECT_EQ(Read(cache, file, 100, kBlock, &counts, &alone), file.data_.substr(100, kBlock));
  EXPECT_EQ(counts.storage_bytes, 7 * kBlock);
  EXPECT_EQ(file.reads_, 2);
}

TEST(ReadCacheTest, BlocksAnotherDeclaredReaderWantsAreKeptForIt) {
  ReadCache cache(Small(16));
  const CountingFile file(Pattern(8 * kBlock));
  ReadCounts first, second;
  ReadCache::Interest a = cache.Declare({{kPath, 0, 4 * kBlock}});
  const ReadCache::Interest b = cache.Declare({{kPath, 2 * kBlock + 10, kBlock}, {"/other/file", 0, 100}});
  // Blocks 0-1 go straight to a's memory; blocks 2-3, which b wants too, are kept.
  EXPECT_EQ(Read(cache, file, 0, 4 * kBlock, &first, &a), file.data_.substr(0, 4 * kBlock));
  EXPECT_EQ(first.storage_bytes, 4 * kBlock);
  EXPECT_EQ(cache.held_bytes(), 2 * kBlock);
  EXPECT_EQ(Read(cache, file, 2 * kBlock + 10, kBlock, &second, &b),
            file.data_.substr(2 * kBlock + 10, kBlock));
  EXPECT_EQ(second.storage_bytes, 0u);
  // Once a is gone, b wants block 0 alone: read straight, not kept.
  a = ReadCache::Interest();
  EXPECT_EQ(Read(cache, file, 0, 10, &second, &b), file.data_.substr(0, 10));
  EXPECT_EQ(second.storage_bytes, 10u);
  EXPECT_EQ(cache.held_bytes(), 2 * kBlock);
  // A reader that declared nothing is served by held blocks all the same.
  const ReadCache::Interest late;
  EXPECT_EQ(Read(cache, file, 3 * kBlock, kBlock, &second, &late), file.data_.substr(3 * kBlock, kBlock));
  EXPECT_EQ(second.storage_bytes, 10u);
}

TEST(ReadCacheTest, HeldBytesStayWithinCapacityLeastRecentlyUsedGoingFirst) {
  ReadCache cache(Small(2));
  const CountingFile file(Pattern(4 * kBlock));
  for (uint64_t b : {0, 1, 0, 2})
    ASSERT_EQ(Read(cache, file, b * kBlock, 10), file.data_.substr(b * kBlock, 10));
  EXPECT_EQ(file.reads_, 3);  // block 0 was used again, so block 1 went
  EXPECT_EQ(cache.held_bytes(), 2 * kBlock);
  EXPECT_EQ(Read(cache, file, 0, 10), file.data_.substr(0, 10));
  EXPECT_EQ(file.reads_, 3);
  EXPECT_EQ(Read(cache, file, kBlock, 10), file.data_.substr(kBlock, 10));
  EXPECT_EQ(file.reads_, 4);
}

TEST(ReadCacheTest, WithoutCapacityEveryReadGoesToStorageAndIsCounted) {
  ReadCache cache(Small(0));
  const CountingFile file(Pattern(2 * kBlock));
  ReadCounts counts;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Read(cache, file, 10, 100, &counts), file.data_.substr(10, 100));
  EXPECT_EQ(file.reads_, 3);
  EXPECT_EQ(counts.storage_bytes, 300u);
  EXPECT_EQ(cache.hit_bytes(), 0u);
}

TEST(ReadCacheTest, AStepReplacedOrRemovedThroughTheFileSystemIsForgotten) {
  testing::TempDir dir;
  ReadCache cache(
      {.capacity_bytes = 1 << 20,
       .linger = absl::Hours(1),
       .block_bytes = kBlock,
       .data_file = [](const std::string& path) { return path.find("ckpt.data") != std::string::npos; }});
  ReadCounts counts;
  CachingFileSystem fs(PosixFileSystem(), &cache, CachingFileSystem::Reads::kCached, &counts);
  const std::string step = dir.Sub("step-1"), tmp = dir.Sub("tmp");
  const std::string data = JoinPath(step, "ckpt.data-00000-of-00001");
  auto write = [&](const std::string& at, const std::string& contents) {
    ASSERT_TRUE(fs.CreateDirs(at, 0700).ok());
    auto out = *fs.NewWritableFile(JoinPath(at, "ckpt.data-00000-of-00001"));
    ASSERT_TRUE(out->Append(contents).ok());
    ASSERT_TRUE(out->Close().ok());
  };
  auto read = [&] {
    auto file = *fs.NewRandomAccessFile(data);
    std::string out(file->Size(), 'x');
    EXPECT_TRUE(file->Read(0, out.size(), out.data()).ok());
    return out;
  };
  write(step, "first version");
  EXPECT_EQ(read(), "first version");
  EXPECT_EQ(read(), "first version");
  EXPECT_EQ(counts.storage_bytes, 13u);  // once
  // The same step committed again under its number: renamed into place.
  ASSERT_TRUE(fs.DeleteRecursively(step).ok());
  write(tmp, "other version");
  ASSERT_TRUE(fs.Rename(tmp, step).ok());
  EXPECT_EQ(read(), "other version");
  // Files that are not data files are passed on, neither cached nor counted.
  ASSERT_TRUE(fs.WriteFileAtomically(JoinPath(step, "ckpt.index"), "index").ok());
  EXPECT_EQ(*fs.ReadFileToString(JoinPath(step, "ckpt.index"), 100), "index");
  EXPECT_EQ(counts.storage_bytes, 26u);
}

}  // namespace
}  // namespace ckptd
