// NewDirectWritableFile: any mix of aligned and unaligned appends lands byte for byte,
// with O_DIRECT (a disk file system, large appends with several writes in flight) and
// without (tmpfs), through both file systems;
// and reads of any range return the same bytes on either read path. Large appends
// and reads are copied through pooled slots on their way: ranges longer than all slots
// together, from several threads at once and one after another, into memory at any
// address and into pieces that split the slots' chunks, land byte for byte too.
// Memory registered with DirectIoMemory (huge pages in the daemon) skips the slots,
// and is free for its owner to reuse once Append returns, as slotted memory is.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <tuple>

#include "daemon/io/direct_io_memory.h"
#include "daemon/io/file_system.h"
#include "tests/common/temp_dir.h"

namespace ckptd {
namespace {

struct Aligned {
  explicit Aligned(size_t n) {
    void* p = nullptr;
    EXPECT_EQ(posix_memalign(&p, 4096, n), 0);
    data = static_cast<char*>(p);
  }
  ~Aligned() { std::free(data); }
  char* data;
};

// Fills n bytes (a multiple of 8) with a stream that `seed` picks.
void FillRandom(char* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t word = rng();
    std::memcpy(p + i, &word, 8);
  }
}

// Whether the file system under `dir` takes O_DIRECT: where it does not, nothing is
// queued or goes in place.
bool TakesODirect(const testing::TempDir& dir) {
  const int probe = ::open(dir.Sub("probe").c_str(), O_CREAT | O_WRONLY | O_DIRECT | O_CLOEXEC, 0600);
  if (probe < 0) return false;
  ::close(probe);
  return true;
}

// Reads ranges that do and do not qualify for the O_DIRECT read path (aligned offset,
// aligned destination, at least 256 KiB, whole blocks or with a tail).
void ReadRangesAndCheck(FileSystem* fs, const std::string& path, const std::string& expected) {
  auto file = fs->NewRandomAccessFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  Aligned dst((16 << 20) + 4096);
  const std::vector<std::tuple<uint64_t, size_t, size_t>> reads = {
      // offset, size, dst offset
      {0, 1 << 20, 0}, {4096, (5 << 20) + 123, 0}, {8192, 300 << 10, 1},   {7, 1 << 20, 0},
      {0, 100, 0},     {4096 * 5, 16 << 20, 4096}, {0, expected.size(), 0}};
  for (const auto& [offset, size, at] : reads) {
    if (offset + size > expected.size() || at + size > (16u << 20) + 4096) continue;
    std::memset(dst.data + at, 0, size);
    ASSERT_TRUE((*file)->Read(offset, size, dst.data + at).ok()) << offset << "+" << size;
    EXPECT_EQ(std::memcmp(dst.data + at, expected.data() + offset, size), 0) << offset << "+" << size;
  }
  // Past the end is refused, not short.
  EXPECT_TRUE(absl::IsOutOfRange((*file)->Read(expected.size() - 10, 4096, dst.data)));
  // ReadV: one request into aligned whole-block pieces with a short last one (the
  // preadv path), into unaligned pieces (piece by piece), and past the end.
  const std::vector<std::vector<std::pair<size_t, size_t>>> layouts = {
      {{0, 4 << 20}, {8 << 20, 4 << 20}, {4 << 20, (1 << 20) + 77}},  // dst offset, size
      {{1, 4096}, {8192, 100}, {20000, 5000}}};
  for (uint64_t offset : {uint64_t{0}, uint64_t{4096} * 3}) {
    for (const auto& layout : layouts) {
      std::vector<absl::Span<char>> pieces;
      size_t total = 0;
      for (const auto& [at, size] : layout) {
        std::memset(dst.data + at, 0, size);
        pieces.emplace_back(dst.data + at, size);
        total += size;
      }
      if (offset + total > expected.size()) continue;
      ASSERT_TRUE((*file)->ReadV(offset, pieces).ok()) << offset;
      uint64_t at_file = offset;
      for (const absl::Span<char>& piece : pieces) {
        EXPECT_EQ(std::memcmp(piece.data(), expected.data() + at_file, piece.size()), 0) << at_file;
        at_file += piece.size();
      }
    }
  }
  std::vector<absl::Span<char>> past = {absl::Span<char>(dst.data, 4096),
                                        absl::Span<char>(dst.data + 4096, 4096)};
  EXPECT_TRUE(absl::IsOutOfRange((*file)->ReadV(expected.size() - 4096, past)));
}

void WriteMixAndCheck(FileSystem* fs, const std::string& path) {
  Aligned big(24 << 20);
  std::mt19937 rng(42);
  for (size_t i = 0; i < (24u << 20); ++i) big.data[i] = static_cast<char>(rng());
  std::string expected;
  auto file = fs->NewDirectWritableFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  // Aligned and large enough to be written as several chunks in flight, the last one
  // short; aligned and large; unaligned small; aligned again behind a partial block; an
  // aligned start with an unaligned length; larger than the internal buffer.
  const std::vector<std::pair<size_t, size_t>> pieces = {
      {4096, (21 << 20) + 12288}, {0, 3 << 20}, {5, 100},    {4096, 8192}, {0, 10000},
      {8192, (9 << 20) + 17},     {1, 4095},    {4096, 4096}};
  for (const auto& [offset, size] : pieces) {
    ASSERT_TRUE((*file)->Append(absl::string_view(big.data + offset, size)).ok());
    expected.append(big.data + offset, size);
  }
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  auto got = fs->ReadFileToString(path, 1 << 30);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), expected.size());
  EXPECT_TRUE(*got == expected);
  ReadRangesAndCheck(fs, path, expected);
}

TEST(DirectWritableFileTest, DiskFileSystem) {
  testing::TempDir dir;
  WriteMixAndCheck(PosixFileSystem(), dir.Sub("data"));
  auto confined = ConfinedFileSystem(dir.path());
  ASSERT_TRUE(confined.ok());
  WriteMixAndCheck(confined->get(), dir.Sub("confined"));
  // Replacing an existing file works as NewWritableFile does.
  WriteMixAndCheck(confined->get(), dir.Sub("confined"));
}

// Each writer appends 72 MiB (more than its 16 slots of 4 MiB hold, so slots are
// reused while other chunks are in flight) of bytes no other writer has.
TEST(DirectWritableFileTest, LargeAppendsFromWritersAtOnceLandWhole) {
  testing::TempDir dir;
  constexpr size_t kBytes = (72u << 20) + 8192;
  auto write_and_check = [&](int writer) {
    Aligned bytes(kBytes);
    FillRandom(bytes.data, kBytes, 1000 + writer);
    const std::string path = dir.Sub("writer" + std::to_string(writer));
    auto file = PosixFileSystem()->NewDirectWritableFile(path);
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_TRUE((*file)->Append(absl::string_view(bytes.data, kBytes)).ok());
    ASSERT_TRUE((*file)->Sync().ok());
    ASSERT_TRUE((*file)->Close().ok());
    auto got = PosixFileSystem()->ReadFileToString(path, 1 << 30);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), kBytes);
    EXPECT_EQ(std::memcmp(got->data(), bytes.data, kBytes), 0) << "writer " << writer;
    auto file_in = PosixFileSystem()->NewRandomAccessFile(path);
    ASSERT_TRUE(file_in.ok()) << file_in.status();
    // All of it but the first block, into memory at an odd address.
    Aligned back(kBytes + 4096);
    std::memset(back.data, 0, kBytes + 4096);
    ASSERT_TRUE((*file_in)->Read(4096, kBytes - 4096, back.data + 3).ok());
    EXPECT_EQ(std::memcmp(back.data + 3, bytes.data + 4096, kBytes - 4096), 0) << "writer " << writer;
    // Into pieces of 3 MiB, 5 MiB and 1 MiB in turn (each chunk lands in two), a
    // block apart in memory, the last one with a tail past its whole blocks.
    Aligned spread(kBytes + (1 << 20));
    std::memset(spread.data, 0, kBytes + (1 << 20));
    std::vector<absl::Span<char>> pieces;
    const size_t sizes[] = {3u << 20, 5u << 20, 1u << 20};
    for (size_t at = 0, i = 0; at < kBytes - 8192; at += pieces.back().size(), ++i) {
      pieces.emplace_back(spread.data + at + i * 4096, std::min(sizes[i % 3], kBytes - 8192 - at));
    }
    pieces.back() = absl::Span<char>(pieces.back().data(), pieces.back().size() + 100);
    ASSERT_TRUE((*file_in)->ReadV(0, pieces).ok());
    for (size_t at = 0; const absl::Span<char>& piece : pieces) {
      EXPECT_EQ(std::memcmp(piece.data(), bytes.data + at, piece.size()), 0)
          << "writer " << writer << " at " << at;
      at += piece.size();
    }
  };
  std::vector<std::thread> at_once;
  for (int writer = 0; writer < 3; ++writer) at_once.emplace_back(write_and_check, writer);
  for (std::thread& t : at_once) t.join();
  write_and_check(3);  // after the others: a pooled region, holding their last bytes
}

TEST(DirectIoMemoryTest, ContainsOnlyAlignedRangesInsideOneRegisteredRange) {
  Aligned a(8 << 20), b(8 << 20);
  direct_io_memory::Add(a.data, 8 << 20);
  direct_io_memory::Add(b.data, 4 << 20);
  EXPECT_TRUE(direct_io_memory::Contains(a.data, 8 << 20));
  EXPECT_TRUE(direct_io_memory::Contains(a.data + 4096, (8 << 20) - 4096));
  EXPECT_FALSE(direct_io_memory::Contains(a.data + 4096, 8 << 20));  // runs past its end
  EXPECT_FALSE(direct_io_memory::Contains(a.data + 1, 4096));        // not block-aligned
  EXPECT_TRUE(direct_io_memory::Contains(b.data, 4 << 20));
  EXPECT_FALSE(direct_io_memory::Contains(b.data, (4 << 20) + 1));  // only 4 MiB of b registered
  EXPECT_FALSE(direct_io_memory::Contains(nullptr, 0));
  direct_io_memory::Remove(a.data);
  EXPECT_FALSE(direct_io_memory::Contains(a.data, 4096));
  EXPECT_TRUE(direct_io_memory::Contains(b.data + (2 << 20), 4096));
  direct_io_memory::Remove(b.data);
  EXPECT_FALSE(direct_io_memory::Contains(b.data, 4096));
}

// Memory registered with DirectIoMemory (in the daemon: a trainer's segment in huge
// pages) is written from and read into with O_DIRECT in place, skipping the slots:
// the bytes land exactly, at file offsets other than 0 and with unaligned tails, and
// the in-place counter shows that path ran. Ordinary aligned memory stands in for
// huge pages here: O_DIRECT works into any aligned memory, only slower.
TEST(DirectWritableFileTest, RegisteredMemoryIsWrittenFromAndReadIntoInPlace) {
  testing::TempDir dir;
  const std::string path = dir.Sub("in-place");
  if (!TakesODirect(dir))
    GTEST_SKIP() << "the temp directory's file system refuses O_DIRECT: nothing goes in place";
  constexpr size_t kBytes = (24u << 20) + 8192;
  Aligned source(kBytes);
  FillRandom(source.data, kBytes, 7);
  direct_io_memory::Add(source.data, kBytes);
  const uint64_t before_write = direct_io_memory::InPlaceBytes();
  auto file = PosixFileSystem()->NewDirectWritableFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->Append(absl::string_view(source.data, kBytes)).ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  const uint64_t written_in_place = direct_io_memory::InPlaceBytes() - before_write;
  auto got = PosixFileSystem()->ReadFileToString(path, 1 << 30);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), kBytes);
  EXPECT_EQ(std::memcmp(got->data(), source.data, kBytes), 0);

  Aligned back(kBytes);
  direct_io_memory::Add(back.data, kBytes);
  auto in = PosixFileSystem()->NewRandomAccessFile(path);
  ASSERT_TRUE(in.ok()) << in.status();
  const uint64_t before_read = direct_io_memory::InPlaceBytes();
  // From the second block on, to a destination a block in; the tail of 17 bytes past
  // the whole blocks is read buffered.
  constexpr size_t kRead = (9u << 20) + 17;
  std::memset(back.data, 0, kBytes);
  ASSERT_TRUE((*in)->Read(4096, kRead, back.data + 4096).ok());
  const uint64_t read_in_place = direct_io_memory::InPlaceBytes() - before_read;
  EXPECT_EQ(std::memcmp(back.data + 4096, source.data + 4096, kRead), 0);
  EXPECT_EQ(back.data[0], 0);             // nothing before the destination
  EXPECT_EQ(back.data[4096 + kRead], 0);  // nor after it
  // At an odd address inside the registered memory: through the slots, still exact.
  std::memset(back.data, 0, kBytes);
  ASSERT_TRUE((*in)->Read(8192, 1 << 20, back.data + 3).ok());
  EXPECT_EQ(std::memcmp(back.data + 3, source.data + 8192, 1 << 20), 0);
  direct_io_memory::Remove(source.data);
  direct_io_memory::Remove(back.data);

  // The aligned read went in place, all its whole blocks and nothing else; so did the
  // large append's chunks, which queue through io_uring (without it at build time
  // they are written one at a time, from the source as they always were).
  EXPECT_EQ(read_in_place, kRead / 4096 * 4096);
#ifdef CKPTD_IO_QUEUED
  EXPECT_GE(written_in_place, (24u << 20));
  EXPECT_LE(written_in_place, kBytes);
#else
  EXPECT_EQ(written_in_place, 0u);
#endif
}

// Append lets the caller reuse its bytes as soon as it returns, whether they went in
// place or through the slots: bytes overwritten then are not what the file holds (a
// queue left in flight past Append would write some of them).
TEST(DirectWritableFileTest, AppendLeavesTheSourceFreeWhenItReturns) {
  testing::TempDir dir;
  if (!TakesODirect(dir))
    GTEST_SKIP() << "the temp directory's file system refuses O_DIRECT: nothing is queued";
  constexpr size_t kBytes = 48u << 20;
  Aligned registered(kBytes), ordinary(kBytes);
  direct_io_memory::Add(registered.data, kBytes);
  for (char* source : {registered.data, ordinary.data}) {
    FillRandom(source, kBytes, source == registered.data ? 11 : 12);
    const std::string original(source, kBytes);
    auto file = PosixFileSystem()->NewDirectWritableFile(dir.Sub("plain"));
    ASSERT_TRUE(file.ok()) << file.status();
    const uint64_t before = direct_io_memory::InPlaceBytes();
    ASSERT_TRUE((*file)->Append(absl::string_view(source, kBytes)).ok());
    const uint64_t in_place = direct_io_memory::InPlaceBytes() - before;
    std::memset(source, 0x5a, kBytes);
    ASSERT_TRUE((*file)->Sync().ok());
    ASSERT_TRUE((*file)->Close().ok());
    auto back = PosixFileSystem()->ReadFileToString(dir.Sub("plain"), 1 << 30);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(*back == original) << (source == registered.data ? "in place" : "through the slots");
#ifdef CKPTD_IO_QUEUED
    // The path the label names is the one that ran.
    EXPECT_EQ(in_place, source == registered.data ? kBytes : 0u);
#else
    (void)in_place;
#endif
  }
  direct_io_memory::Remove(registered.data);
}

TEST(DirectWritableFileTest, TmpfsFallsBackWhereODirectIsRefused) {
  if (!PosixFileSystem()->IsDirectory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  const std::string dir = "/dev/shm/ckptd-direct-test-" + std::to_string(::getpid());
  ASSERT_TRUE(PosixFileSystem()->CreateDirs(dir, 0700).ok());
  WriteMixAndCheck(PosixFileSystem(), dir + "/data");
  auto confined = ConfinedFileSystem(dir);
  ASSERT_TRUE(confined.ok());
  WriteMixAndCheck(confined->get(), dir + "/confined");
  PosixFileSystem()->DeleteRecursively(dir).IgnoreError();
}

}  // namespace
}  // namespace ckptd
