// NewDirectWritableFile: any mix of aligned and unaligned appends lands byte for byte,
// with O_DIRECT (a disk file system) and without (tmpfs), through both file systems.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

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

void WriteMixAndCheck(FileSystem* fs, const std::string& path) {
  Aligned big(24 << 20);
  std::mt19937 rng(42);
  for (size_t i = 0; i < (24u << 20); ++i) big.data[i] = static_cast<char>(rng());
  std::string expected;
  auto file = fs->NewDirectWritableFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  // Aligned and large; unaligned small; aligned again behind a partial block; an
  // aligned start with an unaligned length; larger than the internal buffer.
  const std::vector<std::pair<size_t, size_t>> pieces = {
      {0, 3 << 20}, {5, 100}, {4096, 8192}, {0, 10000}, {8192, (9 << 20) + 17}, {1, 4095}, {4096, 4096}};
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
