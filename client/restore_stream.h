// Parses a RestoreResponse straight from the slices gRPC received it in, without
// copying a chunk's data: the client scatters the data from the slices into the
// trainer's buffers, one copy instead of two (protobuf's parse, then the scatter) and
// no allocation per 4 MiB chunk.
//
// Internal to the client library (not installed). Pure; the slices must outlive the
// parsed response, whose data runs point into them.
#ifndef CKPTD_CLIENT_RESTORE_STREAM_H_
#define CKPTD_CLIENT_RESTORE_STREAM_H_

#include <grpcpp/support/slice.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "ckptd/v1/ckptd.pb.h"

namespace ckptd::internal {

// The method the generated stub calls, for reading its replies as raw bytes.
inline constexpr char kRestoreMethod[] = "/ckptd.v1.Ckptd/Restore";

struct RawRestoreResponse {
  bool has_header = false;
  v1::RestoreHeader header{};
  bool has_trailer = false;
  v1::RestoreTrailer trailer{};
  bool has_ready = false;
  v1::RestoreReady ready{};
  bool has_chunk = false;
  int64_t tensor_index = 0;
  int64_t offset = 0;
  size_t data_size = 0;
  std::vector<std::pair<const char*, size_t>> data{};  // contiguous runs, in order, into the slices
};

// INVALID_ARGUMENT for bytes that are not a well-formed RestoreResponse. Fields may
// come in any order; unknown fields are skipped, as protobuf does.
absl::Status ParseRestoreResponse(const std::vector<grpc::Slice>& slices, RawRestoreResponse* out);

}  // namespace ckptd::internal

#endif  // CKPTD_CLIENT_RESTORE_STREAM_H_
