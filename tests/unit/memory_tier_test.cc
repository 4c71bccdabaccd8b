#include "daemon/coord/memory_tier.h"

#include <gtest/gtest.h>

#include <cstring>

#include "daemon/base/dtype.h"
#include "daemon/bundle/bundle.h"

namespace ckptd {
namespace {

MemoryTier::Piece PieceOf(StagingArea& staging, uint64_t offset, const std::string& bytes) {
  StagedBuffer buffer = *staging.Allocate(static_cast<int64_t>(bytes.size()));
  std::memcpy(buffer.data(), bytes.data(), bytes.size());
  return {.offset = offset, .bytes = std::move(buffer)};
}

std::string ReadAll(const RandomAccessFile& file, uint64_t offset, size_t n) {
  std::string out(n, 'x');
  const absl::Status s = file.Read(offset, n, out.data());
  return s.ok() ? out : s.ToString();
}

TEST(MemoryTierTest, AKeptFileReadsLikeTheFileWithZeroPaddingBetweenEntries) {
  StagingArea staging;
  MemoryTier tier(2);
  std::vector<MemoryTier::Piece> pieces;
  pieces.push_back(PieceOf(staging, 8, "world"));  // out of order on purpose
  pieces.push_back(PieceOf(staging, 0, "hello"));
  tier.Keep({"run", 1}, "/root/run/step-00000001/ckpt.data-00000-of-00001", 16, std::move(pieces));
  std::unique_ptr<RandomAccessFile> file = tier.Open("/root/run/step-00000001/ckpt.data-00000-of-00001");
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(file->Size(), 16u);
  EXPECT_EQ(ReadAll(*file, 0, 16), std::string("hello\0\0\0world\0\0\0", 16));
  EXPECT_EQ(ReadAll(*file, 3, 7), std::string("lo\0\0\0wo", 7));
  EXPECT_EQ(ReadAll(*file, 9, 2), "or");
  EXPECT_NE(ReadAll(*file, 10, 7).find("OUT_OF_RANGE"), std::string::npos);
  EXPECT_EQ(tier.Open("/root/run/step-00000001/ckpt.index"), nullptr);
}

TEST(MemoryTierTest, AKeptFileSaysWhereWholeEntriesLieInMemory) {
  StagingArea staging;
  MemoryTier tier(1);
  std::vector<MemoryTier::Piece> pieces;
  pieces.push_back(PieceOf(staging, 0, "hello"));
  pieces.push_back(PieceOf(staging, 8, "world"));
  tier.Keep({"run", 1}, "/f", 16, std::move(pieces));
  std::unique_ptr<RandomAccessFile> file = tier.Open("/f");
  ASSERT_NE(file, nullptr);
  const char* world = file->InMemory(8, 5);
  ASSERT_NE(world, nullptr);
  EXPECT_EQ(std::string(world, 5), "world");
  EXPECT_EQ(std::string(file->InMemory(1, 3), 3), "ell");
  // Ranges that reach into padding or past the end are not one piece's bytes.
  EXPECT_EQ(file->InMemory(3, 6), nullptr);
  EXPECT_EQ(file->InMemory(5, 2), nullptr);
  EXPECT_EQ(file->InMemory(12, 8), nullptr);
}

TEST(MemoryTierTest, CheckedCopyKeepsOnlyBytesThatMatchTheFilesChecksum) {
  StagingArea staging;
  std::string bytes(3 << 20, '\0');  // more than one of CopyAndExtend's chunks
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 131 + 7);
  const MemoryTier::Piece from = PieceOf(staging, 0, bytes);
  const uint32_t crc =
      *EntryChecksum(kFloat, static_cast<int64_t>(bytes.size() / 4), bytes.data(), bytes.size());
  absl::StatusOr<StagedBuffer> copy = MemoryTier::CheckedCopy(
      from.bytes, *staging.Allocate(from.bytes.size()), kFloat, static_cast<int64_t>(bytes.size() / 4), crc);
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(std::string(copy->data(), static_cast<size_t>(copy->size())), bytes);
  // One byte changed since the file was written: the copy is refused.
  absl::StatusOr<StagedBuffer> stale =
      MemoryTier::CheckedCopy(from.bytes, *staging.Allocate(from.bytes.size()), kFloat,
                              static_cast<int64_t>(bytes.size() / 4), crc ^ 1);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kDataLoss) << stale.status();
  // String tensors are checked the way TensorFlow checksums them.
  const std::string strings = EncodeStringScalar("state");
  const MemoryTier::Piece s = PieceOf(staging, 0, strings);
  const uint32_t string_crc = *EntryChecksum(kString, 1, strings.data(), strings.size());
  EXPECT_TRUE(
      MemoryTier::CheckedCopy(s.bytes, *staging.Allocate(s.bytes.size()), kString, 1, string_crc).ok());
  EXPECT_EQ(MemoryTier::CheckedCopy(s.bytes, *staging.Allocate(s.bytes.size()), kString, 1, string_crc + 1)
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
}

TEST(MemoryTierTest, KeepsTheNewestStepsAndAnOpenFileOutlivesItsEviction) {
  StagingArea staging;
  MemoryTier tier(2);
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<MemoryTier::Piece> pieces;
    pieces.push_back(PieceOf(staging, 0, std::string(4096, static_cast<char>('0' + step))));
    tier.Keep({"run", step}, "f" + std::to_string(step), 4096, std::move(pieces));
  }
  ASSERT_EQ(tier.Steps().size(), 2u);
  EXPECT_EQ(tier.Steps()[0].key.step, 2);
  EXPECT_EQ(tier.Open("f1"), nullptr);
  EXPECT_EQ(staging.bytes_staged(), 2 * 4096);
  std::unique_ptr<RandomAccessFile> open = tier.Open("f2");
  ASSERT_TRUE(tier.EvictOldest());
  EXPECT_EQ(tier.Open("f2"), nullptr);
  EXPECT_EQ(ReadAll(*open, 0, 3), "222");  // still readable, and still staged
  EXPECT_EQ(staging.bytes_staged(), 2 * 4096);
  open.reset();
  EXPECT_EQ(staging.bytes_staged(), 4096);
  tier.Forget({"run", 3});
  EXPECT_FALSE(tier.EvictOldest());
  EXPECT_EQ(staging.bytes_staged(), 0);
}

TEST(MemoryTierTest, AFullStagingAreaAsksTheReclaimerBeforeItWaits) {
  StagingArea staging(8192);
  MemoryTier tier(4);
  staging.SetReclaimer([&tier] { return tier.EvictOldest(); });
  for (int64_t step = 1; step <= 2; ++step) {
    std::vector<MemoryTier::Piece> pieces;
    pieces.push_back(PieceOf(staging, 0, std::string(4096, 'k')));
    tier.Keep({"run", step}, "f" + std::to_string(step), 4096, std::move(pieces));
  }
  // A new 4 KiB save finds the budget full of kept bytes: the oldest kept step goes.
  absl::StatusOr<StagedBuffer> fresh = staging.Allocate(4096);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ASSERT_EQ(tier.Steps().size(), 1u);
  EXPECT_EQ(tier.Steps()[0].key.step, 2);
}

}  // namespace
}  // namespace ckptd
