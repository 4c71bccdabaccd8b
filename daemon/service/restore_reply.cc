#include "daemon/service/restore_reply.h"

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/slice.h>

#include <cstdlib>
#include <cstring>
#include <string>
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

constexpr uint32_t kDelimited = 2, kVarint = 0;

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

void AppendTag(uint32_t field, uint32_t wire_type, std::string* out) {
  AppendVarint(field << 3 | wire_type, out);
}

size_t VarintSize(uint64_t value) {
  size_t n = 1;
  for (; value >= 0x80; value >>= 7) ++n;
  return n;
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
  size_t chunk_size = 0;
  if (index != 0) chunk_size += 1 + VarintSize(index);
  if (at != 0) chunk_size += 1 + VarintSize(at);
  if (!data.empty()) chunk_size += 1 + VarintSize(data.size()) + data.size();
  std::string prefix;
  AppendTag(v1::RestoreResponse::kChunkFieldNumber, kDelimited, &prefix);
  AppendVarint(chunk_size, &prefix);
  if (index != 0) {
    AppendTag(v1::RestoreChunk::kTensorIndexFieldNumber, kVarint, &prefix);
    AppendVarint(index, &prefix);
  }
  if (at != 0) {
    AppendTag(v1::RestoreChunk::kOffsetFieldNumber, kVarint, &prefix);
    AppendVarint(at, &prefix);
  }
  if (data.empty()) {
    grpc::Slice only(prefix);
    return grpc::ByteBuffer(&only, 1);
  }
  AppendTag(v1::RestoreChunk::kDataFieldNumber, kDelimited, &prefix);
  AppendVarint(data.size(), &prefix);
  grpc::Slice slices[2] = {grpc::Slice(prefix), CopiedSlice(data)};
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace ckptd
