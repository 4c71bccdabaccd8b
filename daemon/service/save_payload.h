// Turns one validated Save into staged memory. The tensors' boxes become segments in
// stream order; their bytes come either from a chunk stream (each segment's buffer
// allocated when its first byte arrives, so a header alone reserves nothing) or from
// the trainer's mapped shared-memory segment (borrowed where they lie). Tensors in
// device memory are copied after the host bytes, so a trainer streaming host tensors
// is not held up by device copies. Build() then yields the TrainerPayload the
// registry stages.
//
// One builder per Save, used by that Save's handler thread only. The staging area and
// device stager must outlive it.
#ifndef CKPTD_DAEMON_SERVICE_SAVE_PAYLOAD_H_
#define CKPTD_DAEMON_SERVICE_SAVE_PAYLOAD_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ckptd/v1/ckptd.pb.h"
#include "daemon/layout/mesh.h"
#include "daemon/service/validation.h"
#include "daemon/staging/device_stager.h"
#include "daemon/staging/shared_segment.h"
#include "daemon/staging/staging_area.h"

namespace ckptd {

// The bytes `tensors` declare; RESOURCE_EXHAUSTED past limits.max_request_bytes or
// what staging can ever hold (`staging_limit`).
absl::StatusOr<int64_t> CheckSaveSize(const std::vector<CheckedTensor>& tensors, int64_t max_request_bytes,
                                      int64_t staging_limit);

class SavePayloadBuilder {
 public:
  // `tensors` must outlive the builder. When staging memory is full, allocations wait
  // for room until `deadline` (the caller's).
  SavePayloadBuilder(StagingArea* staging, DeviceStager* device, const std::vector<CheckedTensor>& tensors,
                     absl::Time deadline);

  // The bytes the stream or segment must carry: every host tensor's boxes.
  int64_t host_bytes() const { return host_bytes_; }

  // Stages the host bytes from `mapped`, which holds exactly host_bytes() bytes.
  absl::Status BorrowFrom(const std::shared_ptr<SharedSegment>& mapped);
  // Appends one data chunk (at most wire::kSaveChunkBytes) to the segments in order.
  // INVALID_ARGUMENT for a chunk that is too big or carries bytes past host_bytes().
  absl::Status AddChunk(const std::string& data);
  // INVALID_ARGUMENT unless the chunks added up to host_bytes().
  absl::Status EndOfStream() const;
  // Copies the tensors in device memory into staging.
  absl::Status CopyFromDevice();
  // Everything staged, in the registry's terms; float32 narrowed to bfloat16 when the
  // header asks, trainer state as string scalars. Consumes the builder's buffers.
  absl::StatusOr<TrainerPayload> Build(const v1::SaveHeader& header, const Placement& placement);

 private:
  // One box of one tensor: a tensor's box, or each of its device boxes.
  struct Segment {
    size_t tensor = 0;
    Box box{};
    int64_t bytes = 0;
    StagedBuffer buffer{};
  };

  StagingArea* staging_;
  DeviceStager* device_;
  const std::vector<CheckedTensor>& tensors_;
  absl::Time deadline_;
  std::vector<Segment> segments_;         // host bytes, in stream order
  std::vector<Segment> device_segments_;  // copied from device memory
  int64_t host_bytes_ = 0;
  size_t current_ = 0;    // the segment the next streamed byte goes to
  int64_t filled_ = 0;    // bytes of segments_[current_] filled so far
  int64_t received_ = 0;  // streamed bytes so far
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_SERVICE_SAVE_PAYLOAD_H_
