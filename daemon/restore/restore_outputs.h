// Where each planned tensor of one restore lands, and how the reply carries it:
// straight into the trainer's shared-memory segment (a shared-memory reply), into a
// range of one of the trainer's own segments (host_memory), into staging memory on
// its way to device memory, or into staging memory on its way out as stream chunks
// (or sent as it is kept, from the memory tier). Staging memory, because it counts
// against the daemon's budget and its pool hands back pages already touched (fresh
// pages would be faulted in at a fraction of memcpy speed).
//
// The functions here read and send for one restore call, on its thread (with
// `threads` reading threads of their own, joined before they return).
#ifndef CKPTD_DAEMON_RESTORE_RESTORE_OUTPUTS_H_
#define CKPTD_DAEMON_RESTORE_RESTORE_OUTPUTS_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "ckptd/v1/ckptd.pb.h"
#include "daemon/bundle/bundle.h"
#include "daemon/restore/restore_plan.h"
#include "daemon/restore/restore_sink.h"
#include "daemon/service/validation.h"
#include "daemon/staging/shared_segment.h"
#include "daemon/staging/staging_area.h"

namespace ckptd {

struct RestoreOutputs {
  std::vector<char*> destinations;                          // one per plan item, for ReadPlan
  std::vector<StagedBuffer> streamed;                       // unallocated where the bytes go elsewhere
  std::vector<StagedBuffer> device_buffers;                 // unallocated where not for a device
  std::vector<std::shared_ptr<SharedSegment>> host_memory;  // null where not for host memory
  // Streamed items sent straight from bytes kept in memory (ReadAndStream); empty
  // spans for the others, which go through `streamed`.
  std::vector<absl::Span<const char>> kept;
};

// Binds every item to its destination: device staging buffers allocated now (within
// `deadline`), host_memory and the reply segment (`reply`, null for a streamed reply)
// as given. Streamed items get staging buffers now unless `defer_streamed` (then
// ReadAndStream allocates each group's as it reads it, so a streamed restore holds
// about two groups at once); RESOURCE_EXHAUSTED when a whole streamed reply could
// never fit in staging.
absl::StatusOr<RestoreOutputs> PrepareOutputs(const RestorePlan& plan, const RestoreWants& wants,
                                              const std::shared_ptr<SharedSegment>& reply,
                                              std::vector<std::shared_ptr<SharedSegment>> host_memory,
                                              StagingArea* staging, absl::Time deadline, bool defer_streamed);

// The header of a reply for `plan` of `step`; the caller adds byte counts and state.
v1::RestoreHeader RestoreHeaderFor(const RestorePlan& plan, const RestoreWants& wants, int64_t step,
                                   const std::string& note);

// Sends items [begin, end) as chunks: from out.kept[i] where it is set, else from
// out.streamed[i], freeing each staging buffer once sent.
absl::Status SendChunks(RestoreOutputs& out, size_t begin, size_t end, RestoreSink* sink);

// Reads the plan's items in groups of about 64 MiB, each into staging buffers it
// allocates then, and sends each group's chunks while the next group is read: the
// transfer overlaps the reads instead of following them. Items that are whole
// entries kept in memory (the memory tier) are sent from there, with no copy into
// staging. A failed read stops the stream there. The header must already be sent;
// `out` from PrepareOutputs with defer_streamed.
absl::Status ReadAndStream(BundleReader& reader, const RestorePlan& plan, StagingArea* staging,
                           absl::Time deadline, int threads, RestoreOutputs& out, RestoreSink* sink);

// Reads the whole plan into out.destinations (a shared-memory reply) and, as tensors
// are read and verified, names them in a RestoreReady for about every 16 MiB, so
// that the trainer copies them out of the segment while the rest are read.
absl::Status ReadAndAnnounce(BundleReader& reader, const RestorePlan& plan, const RestoreOutputs& out,
                             int threads, RestoreSink* sink);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_RESTORE_RESTORE_OUTPUTS_H_
