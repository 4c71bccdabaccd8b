#include "daemon/service/restore_reply.h"

#include <google/protobuf/io/coded_stream.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/slice.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/v1/wire.h"

namespace ckptd {
namespace {

static_assert(wire::kRestoreChunkBytes <= kRestoreBlockBytes);

class BlockPool {
 public:
  // Never destroyed (see the header).
  static BlockPool& Get() {
    static BlockPool* const pool = new BlockPool;
    return *pool;
  }
  // Null when memory runs out.
  char* Take() {
    {
      absl::MutexLock lock(&mu_);
      if (!idle_.empty()) {
        char* block = idle_.back();
        idle_.pop_back();
        return block;
      }
    }
    return static_cast<char*>(std::aligned_alloc(4096, kRestoreBlockBytes));
  }
  void Give(char* block) {
    {
      absl::MutexLock lock(&mu_);
      if (static_cast<int>(idle_.size()) < kRestoreIdleBlocks) {
        idle_.push_back(block);
        return;
      }
    }
    std::free(block);
  }

 private:
  absl::Mutex mu_;
  std::vector<char*> idle_ ABSL_GUARDED_BY(mu_);  // most recently given last: the warmest
};

void GiveBack(void* block) { BlockPool::Get().Give(static_cast<char*>(block)); }

using google::protobuf::io::CodedOutputStream;

constexpr uint32_t kDelimited = 2, kVarint = 0;
constexpr uint32_t Tag(int field, uint32_t wire_type) {
  return static_cast<uint32_t>(field) << 3 | wire_type;
}

grpc::Slice CopiedSlice(absl::Span<const char> data) {
  char* block = data.size() <= kRestoreBlockBytes ? BlockPool::Get().Take() : nullptr;
  if (block == nullptr) {
    grpc::Slice copy(data.size());
    std::memcpy(const_cast<uint8_t*>(copy.begin()), data.data(), data.size());
    return copy;
  }
  std::memcpy(block, data.data(), data.size());
  return grpc::Slice(block, data.size(), GiveBack);
}

}  // namespace

absl::StatusOr<grpc::ByteBuffer> EncodeRestoreResponse(const v1::RestoreResponse& message) {
  grpc::ByteBuffer buffer;
  bool own_buffer = false;
  const grpc::Status s =
      grpc::SerializationTraits<v1::RestoreResponse>::Serialize(message, &buffer, &own_buffer);
  if (!s.ok()) return absl::InternalError("cannot serialize a RestoreResponse: " + s.error_message());
  return buffer;
}

grpc::ByteBuffer EncodeRestoreChunk(int32_t tensor_index, int64_t offset, absl::Span<const char> data) {
  // RestoreChunk's fields as protobuf writes them: proto3 leaves out zeros and empty
  // bytes, and an int32 is sign-extended to 64 bits.
  const uint64_t index = static_cast<uint64_t>(static_cast<int64_t>(tensor_index));
  const uint64_t at = static_cast<uint64_t>(offset);
  size_t chunk_size = 0;  // every tag here is one byte
  if (index != 0) chunk_size += 1 + CodedOutputStream::VarintSize64(index);
  if (at != 0) chunk_size += 1 + CodedOutputStream::VarintSize64(at);
  if (!data.empty()) chunk_size += 1 + CodedOutputStream::VarintSize64(data.size()) + data.size();
  uint8_t prefix[4 * (1 + 10)];  // four tags, each with a varint of at most 10 bytes
  uint8_t* end = prefix;
  end = CodedOutputStream::WriteTagToArray(Tag(v1::RestoreResponse::kChunkFieldNumber, kDelimited), end);
  end = CodedOutputStream::WriteVarint64ToArray(chunk_size, end);
  if (index != 0) {
    end = CodedOutputStream::WriteTagToArray(Tag(v1::RestoreChunk::kTensorIndexFieldNumber, kVarint), end);
    end = CodedOutputStream::WriteVarint64ToArray(index, end);
  }
  if (at != 0) {
    end = CodedOutputStream::WriteTagToArray(Tag(v1::RestoreChunk::kOffsetFieldNumber, kVarint), end);
    end = CodedOutputStream::WriteVarint64ToArray(at, end);
  }
  if (!data.empty()) {
    end = CodedOutputStream::WriteTagToArray(Tag(v1::RestoreChunk::kDataFieldNumber, kDelimited), end);
    end = CodedOutputStream::WriteVarint64ToArray(data.size(), end);
  }
  const grpc::Slice head(prefix, static_cast<size_t>(end - prefix));
  if (data.empty()) return grpc::ByteBuffer(&head, 1);
  grpc::Slice slices[2] = {head, CopiedSlice(data)};
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace ckptd
