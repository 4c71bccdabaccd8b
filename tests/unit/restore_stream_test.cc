#include "client/restore_stream.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ckptd/client.h"

namespace ckptd::internal {
namespace {

// Cuts `bytes` into slices at `cuts` (ascending offsets), as gRPC may hand them over.
std::vector<grpc::Slice> SlicesOf(const std::string& bytes, std::vector<size_t> cuts) {
  std::vector<grpc::Slice> slices;
  size_t from = 0;
  cuts.push_back(bytes.size());
  for (size_t cut : cuts) {
    slices.emplace_back(bytes.data() + from, cut - from);  // copies: the slices own their bytes
    from = cut;
  }
  return slices;
}

std::string Joined(const RawRestoreResponse& parsed) {
  std::string out;
  for (const auto& [p, n] : parsed.data) out.append(p, n);
  return out;
}

TEST(RestoreStreamTest, AChunkParsesTheSameFromAnySlicing) {
  v1::RestoreResponse message;
  v1::RestoreChunk* chunk = message.mutable_chunk();
  chunk->set_tensor_index(3);
  chunk->set_offset(int64_t{5} << 32);
  std::string data(70000, '\0');
  std::mt19937 random(1);
  for (char& c : data) c = static_cast<char>(random());
  chunk->set_data(data);
  const std::string bytes = message.SerializeAsString();
  // Every cut in the first 16 bytes (inside tags, varints and the length), and a
  // few inside the data.
  for (size_t cut = 0; cut <= 16; ++cut) {
    for (size_t second : {size_t{17}, size_t{4096}, bytes.size() - 1}) {
      const std::vector<grpc::Slice> slices = SlicesOf(bytes, {cut, second});  // the data points into them
      RawRestoreResponse parsed;
      ASSERT_TRUE(ParseRestoreResponse(slices, &parsed).ok()) << cut;
      EXPECT_TRUE(parsed.has_chunk);
      EXPECT_FALSE(parsed.has_header);
      EXPECT_EQ(parsed.tensor_index, 3);
      EXPECT_EQ(parsed.offset, int64_t{5} << 32);
      EXPECT_EQ(parsed.data_size, data.size());
      EXPECT_TRUE(Joined(parsed) == data) << "cut at " << cut << " and " << second;
    }
  }
}

TEST(RestoreStreamTest, AHeaderParsesAsProtobufDoesAndUnknownFieldsAreSkipped) {
  v1::RestoreResponse message;
  v1::RestoreHeader* header = message.mutable_header();
  header->set_step(42);
  header->set_note("fell back");
  header->add_shared_memory_offsets(-1);
  header->set_storage_bytes_read(1 << 20);
  std::string bytes = message.SerializeAsString();
  bytes += std::string("\x78\x05", 2);  // field 15, varint 5: from a newer daemon
  RawRestoreResponse parsed;
  ASSERT_TRUE(ParseRestoreResponse(SlicesOf(bytes, {1, 2, 3}), &parsed).ok());
  EXPECT_TRUE(parsed.has_header);
  EXPECT_FALSE(parsed.has_chunk);
  EXPECT_EQ(parsed.header.SerializeAsString(), header->SerializeAsString());
}

TEST(RestoreStreamTest, ATrailerCarriesTheCountersAndIsNeitherHeaderNorChunk) {
  v1::RestoreResponse message;
  message.mutable_trailer()->set_storage_bytes_read(int64_t{3} << 30);
  message.mutable_trailer()->set_peer_bytes_received(7);
  const std::vector<grpc::Slice> slices = SlicesOf(message.SerializeAsString(), {2});
  RawRestoreResponse parsed;
  ASSERT_TRUE(ParseRestoreResponse(slices, &parsed).ok());
  EXPECT_TRUE(parsed.has_trailer);
  EXPECT_FALSE(parsed.has_header);
  EXPECT_FALSE(parsed.has_chunk);
  EXPECT_EQ(parsed.trailer.storage_bytes_read(), int64_t{3} << 30);
  EXPECT_EQ(parsed.trailer.peer_bytes_received(), 7);
}

TEST(RestoreStreamTest, AReadyNamesItsTensorsAndIsNoOtherKind) {
  v1::RestoreResponse message;
  for (int32_t index : {4, 0, 70000}) message.mutable_ready()->add_tensor_indices(index);
  const std::string bytes = message.SerializeAsString();
  for (size_t cut = 0; cut <= bytes.size(); ++cut) {
    RawRestoreResponse parsed;
    ASSERT_TRUE(ParseRestoreResponse(SlicesOf(bytes, {cut}), &parsed).ok()) << cut;
    EXPECT_TRUE(parsed.has_ready);
    EXPECT_FALSE(parsed.has_header || parsed.has_chunk || parsed.has_trailer);
    EXPECT_EQ(
        std::vector<int32_t>(parsed.ready.tensor_indices().begin(), parsed.ready.tensor_indices().end()),
        (std::vector<int32_t>{4, 0, 70000}));
  }
  // Cut short inside the indices: malformed, not a shorter list.
  RawRestoreResponse parsed;
  EXPECT_EQ(ParseRestoreResponse(SlicesOf(bytes.substr(0, bytes.size() - 1), {}), &parsed).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RestoreStreamTest, DefaultsOmittedOnTheWireReadAsZero) {
  v1::RestoreResponse message;
  message.mutable_chunk()->set_data("abc");  // tensor_index 0 and offset 0 are not sent
  const std::vector<grpc::Slice> slices = SlicesOf(message.SerializeAsString(), {});
  RawRestoreResponse parsed;
  ASSERT_TRUE(ParseRestoreResponse(slices, &parsed).ok());
  EXPECT_EQ(parsed.tensor_index, 0);
  EXPECT_EQ(parsed.offset, 0);
  EXPECT_EQ(Joined(parsed), "abc");
}

TEST(RestoreStreamTest, TruncatedOrMalformedBytesAreInvalidArgument) {
  v1::RestoreResponse message;
  message.mutable_chunk()->set_tensor_index(1);
  message.mutable_chunk()->set_data(std::string(1000, 'x'));
  const std::string bytes = message.SerializeAsString();
  for (size_t keep : {size_t{1}, size_t{3}, bytes.size() / 2, bytes.size() - 1}) {
    RawRestoreResponse parsed;
    EXPECT_EQ(ParseRestoreResponse(SlicesOf(bytes.substr(0, keep), {}), &parsed).code(),
              absl::StatusCode::kInvalidArgument)
        << "kept " << keep << " of " << bytes.size() << " bytes";
  }
  RawRestoreResponse parsed;
  const std::string group_tag("\x0b", 1);  // field 1, wire type 3: no groups in proto3
  EXPECT_EQ(ParseRestoreResponse(SlicesOf(group_tag, {}), &parsed).code(),
            absl::StatusCode::kInvalidArgument);
}

// A streamed restore's replies are 4 MiB blocks that gRPC allocates and frees, one per
// message; what KeepFreedMemoryForReuse promises is that such a block comes from the
// heap and that freeing it keeps the memory for the next one (glibc's own counters).
// Returns 0 when it does, or prints what went wrong and returns non-zero.
int CheckAMessageSizedBlockStaysInTheHeap() {
  KeepFreedMemoryForReuse();
  constexpr size_t kBlock = 16 << 20;  // above glibc's default thresholds, below 32 MiB
  const struct mallinfo2 before = mallinfo2();
  if (before.fordblks >= kBlock) {
    std::fprintf(stderr, "free heap already holds %zu bytes: the check proves nothing\n", before.fordblks);
    return 2;
  }
  char* block = static_cast<char*>(std::malloc(kBlock));
  if (block == nullptr) return 3;
  std::memset(block, 1, kBlock);
  const struct mallinfo2 held = mallinfo2();
  std::free(block);
  const struct mallinfo2 after = mallinfo2();
  int failed = 0;
  if (held.hblkhd != before.hblkhd) {
    std::fprintf(stderr, "the block was mapped on its own\n");
    failed = 4;
  }
  if (after.fordblks < kBlock) {
    std::fprintf(stderr, "the freed block went back to the kernel\n");
    failed = 5;
  }
  return failed;
}

// In a process of its own: the threadsafe death-test style runs this test again in a
// fresh process, where no earlier test has left freed blocks in the heap (an allocation
// served from those says nothing of the thresholds).
TEST(KeepFreedMemoryTest, AMessageSizedBlockComesFromTheHeapAndStaysAfterFree) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer replaces malloc; glibc's settings do not apply";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::_Exit(CheckAMessageSizedBlockStaysInTheHeap()), ::testing::ExitedWithCode(0), "");
#endif
}

}  // namespace
}  // namespace ckptd::internal
