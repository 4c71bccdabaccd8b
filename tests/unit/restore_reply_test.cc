// The daemon's Restore replies as raw bytes (daemon/service/restore_reply.h): each is
// exactly protobuf's serialization of the same message, the client's parser reads it,
// and a chunk's pooled block is reused only once gRPC has let every hold on it go.
#include "daemon/service/restore_reply.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "client/restore_stream.h"

namespace ckptd {
namespace {

std::string ReplyBytes(const grpc::ByteBuffer& buffer, std::vector<grpc::Slice>* slices) {
  EXPECT_TRUE(buffer.Dump(slices).ok());
  std::string out;
  for (const grpc::Slice& s : *slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

std::string PatternBytes(size_t n) {
  std::string bytes(n, '\0');
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>(i * 131 + 7);
  return bytes;
}

TEST(RestoreReplyTest, AChunkIsProtobufsOwnBytes) {
  const std::vector<int32_t> indices = {0, 1, 127, 128, 300, std::numeric_limits<int32_t>::max()};
  const std::vector<int64_t> offsets = {0, 1, 16383, 16384, int64_t{1} << 40};
  // 1-4 byte lengths, and one past a pooled block.
  const std::vector<size_t> sizes = {0, 1, 127, 128, 16384, (size_t{1} << 21) + 3, kRestoreBlockBytes + 1};
  for (int32_t index : indices) {
    for (int64_t offset : offsets) {
      for (size_t size : sizes) {
        SCOPED_TRACE(::testing::Message() << "index " << index << " offset " << offset << " size " << size);
        const std::string data = PatternBytes(size);
        v1::RestoreResponse message;
        message.mutable_chunk()->set_tensor_index(index);
        message.mutable_chunk()->set_offset(offset);
        message.mutable_chunk()->set_data(data);
        const grpc::ByteBuffer buffer = EncodeRestoreChunk(index, offset, data);
        std::vector<grpc::Slice> slices;
        ASSERT_EQ(ReplyBytes(buffer, &slices), message.SerializeAsString());
        internal::RawRestoreResponse parsed;
        ASSERT_TRUE(internal::ParseRestoreResponse(slices, &parsed).ok());
        EXPECT_TRUE(parsed.has_chunk);
        EXPECT_EQ(parsed.tensor_index, index);
        EXPECT_EQ(parsed.offset, offset);
        EXPECT_EQ(parsed.data_size, size);
      }
    }
  }
}

const char* ChunkDataAddress(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  EXPECT_EQ(slices.size(), 2u);
  return slices.size() == 2 ? reinterpret_cast<const char*>(slices[1].begin()) : nullptr;
}

TEST(RestoreReplyTest, AChunksBlockIsReusedOnlyOnceEveryBufferHoldingItIsGone) {
  const std::string data = PatternBytes(size_t{1} << 20);
  auto first = std::make_unique<grpc::ByteBuffer>(EncodeRestoreChunk(1, 0, data));
  const char* block = ChunkDataAddress(*first);
  ASSERT_NE(block, nullptr);
  EXPECT_NE(block, data.data());                            // a copy...
  EXPECT_EQ(std::string(block, data.size()), data);         // ...of the bytes
  auto taken = std::make_unique<grpc::ByteBuffer>(*first);  // what gRPC holds while it sends
  first.reset();
  const grpc::ByteBuffer second = EncodeRestoreChunk(1, 0, data);
  EXPECT_NE(ChunkDataAddress(second), block);  // still held: another block
  EXPECT_EQ(std::string(block, data.size()), data);
  taken.reset();
  const grpc::ByteBuffer third = EncodeRestoreChunk(1, 0, data);
  EXPECT_EQ(ChunkDataAddress(third), block);  // let go: the same warm block again
}

TEST(RestoreReplyTest, AChunkDoesNotChangeWithItsSource) {
  std::string data = PatternBytes(8192);
  const grpc::ByteBuffer buffer = EncodeRestoreChunk(1, 0, data);
  v1::RestoreResponse message;
  message.mutable_chunk()->set_tensor_index(1);
  message.mutable_chunk()->set_data(data);
  data.assign(data.size(), 'x');  // the staging buffer freed and reused
  std::vector<grpc::Slice> slices;
  EXPECT_EQ(ReplyBytes(buffer, &slices), message.SerializeAsString());
}

TEST(RestoreReplyTest, HeadersAndTrailersAreProtobufsOwnBytes) {
  v1::RestoreResponse header;
  header.mutable_header()->set_step(42);
  header.mutable_header()->set_note("restored step 42");
  header.mutable_header()->add_shared_memory_offsets(-1);
  v1::RestoreResponse trailer;
  trailer.mutable_trailer()->set_storage_bytes_read(1 << 30);
  for (const v1::RestoreResponse& message : {header, trailer}) {
    absl::StatusOr<grpc::ByteBuffer> buffer = EncodeRestoreResponse(message);
    ASSERT_TRUE(buffer.ok());
    std::vector<grpc::Slice> slices;
    EXPECT_EQ(ReplyBytes(*buffer, &slices), message.SerializeAsString());
  }
}

}  // namespace
}  // namespace ckptd
