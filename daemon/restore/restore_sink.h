// RestoreSink: where a restore's reply goes, message by message. The engine
// (Restorer) decides what to send and when; the sink only carries it. The service's
// sink writes gRPC's raw restore stream (service/restore_reply.h); tests may collect
// the messages instead. One restore uses its sink from one thread at a time.
#ifndef CKPTD_DAEMON_RESTORE_RESTORE_SINK_H_
#define CKPTD_DAEMON_RESTORE_RESTORE_SINK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "ckptd/v1/ckptd.pb.h"

namespace ckptd {

class RestoreSink {
 public:
  virtual ~RestoreSink() = default;
  // A header, a RestoreReady or a trailer. CANCELLED once the client has gone.
  virtual absl::Status Send(const v1::RestoreResponse& message) = 0;
  // Bytes [offset, offset + data.size()) of tensor `tensor_index`; `data` may be
  // freed or reused once this returns. CANCELLED once the client has gone.
  virtual absl::Status SendChunk(int32_t tensor_index, int64_t offset, absl::Span<const char> data) = 0;
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_RESTORE_RESTORE_SINK_H_
