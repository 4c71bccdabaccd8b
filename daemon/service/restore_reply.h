// A Restore call's replies as the raw bytes gRPC sends. Protobuf would copy each
// chunk's data twice (into the message's string, then into gRPC's buffers); here it
// is copied once, into a block from a pool of 4 MiB blocks that gRPC hands back when
// it has written them, so that the socket reads memory it has read before.
//
// Why a copy at all rather than slices over the bytes where they lie (a kept step,
// a staging buffer): on the virtual machines this was measured on, the kernel's
// first read of a user page through the socket costs a fault in the hypervisor
// (sending from memory the kernel had not read ran at 0.6 GB/s, then 8 GB/s from the
// same pages), and a restore sends bytes the kernel has not read. The copy runs at
// memcpy speed; the reused blocks keep the kernel's reads on pages it knows.
//
// The daemon serves Restore through gRPC's split-streaming handler with ByteBuffer
// replies (CkptdService's constructor). Nothing changes on the wire: each buffer is
// exactly what RestoreResponse::SerializeAsString gives for the same message.
// Thread-safe; the pool is process-wide and never destroyed, since gRPC may let a
// block go after everything else has shut down.
#ifndef CKPTD_DAEMON_SERVICE_RESTORE_REPLY_H_
#define CKPTD_DAEMON_SERVICE_RESTORE_REPLY_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/sync_stream.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ckptd/v1/ckptd.pb.h"

namespace ckptd {

// How the Restore handler reads its request and writes its replies.
using RestoreStream = grpc::ServerSplitStreamer<v1::RestoreRequest, grpc::ByteBuffer>;

// Bytes of one pooled block; a chunk (wire::kRestoreChunkBytes) fits in one.
inline constexpr size_t kRestoreBlockBytes = size_t{4} << 20;
// Idle blocks the pool keeps (64 MiB); more in flight at once are freed when let go.
inline constexpr int kRestoreIdleBlocks = 16;

// A header, trailer or any other RestoreResponse, serialized by protobuf; INTERNAL
// when it cannot be (a message over 2 GiB).
absl::StatusOr<grpc::ByteBuffer> EncodeRestoreResponse(const v1::RestoreResponse& message);

// A RestoreResponse holding one RestoreChunk. `data` is copied (into a pooled block
// when it fits one), so the caller may free or reuse it once this returns.
grpc::ByteBuffer EncodeRestoreChunk(int32_t tensor_index, int64_t offset, absl::Span<const char> data);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_SERVICE_RESTORE_REPLY_H_
