// Restorer: the restore engine. For one trainer's request it picks the steps to try
// (RestoreSources: the root, then the drain; with fallback, older steps), asks the
// storage tiers for each step's read stack, plans what to read (PlanRestore), binds
// every tensor to its destination (RestoreOutputs) and reads, verifies and sends the
// reply into a RestoreSink. It knows nothing of gRPC: the service validates the
// request, hands it over as a RestoreCall and carries the sink's messages.
//
// Owned by the daemon's wiring, built once; borrows everything it is given, which
// must outlive it. Restore is thread-safe: gRPC's pool calls it concurrently, each
// call with its own sink, and each call runs reading threads of its own.
#ifndef CKPTD_DAEMON_RESTORE_RESTORER_H_
#define CKPTD_DAEMON_RESTORE_RESTORER_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ckptd/v1/ckptd.pb.h"
#include "daemon/base/metrics.h"
#include "daemon/coord/step_registry.h"
#include "daemon/layout/mesh.h"
#include "daemon/restore/restore_outputs.h"
#include "daemon/restore/restore_sink.h"
#include "daemon/restore/restore_sources.h"
#include "daemon/service/validation.h"
#include "daemon/staging/device_stager.h"
#include "daemon/staging/shared_segment.h"
#include "daemon/staging/staging_area.h"
#include "daemon/staging/trainer_memory.h"
#include "daemon/tiers/storage_tiers.h"

namespace ckptd {

// One validated Restore request.
struct RestoreCall {
  std::string run{};
  std::optional<int64_t> step{};  // nullopt: the newest committed step
  // With step unset: try older steps when the newest does not verify. Either way:
  // read everything before sending anything.
  bool fallback = false;
  Placement placement{};
  RestoreWants wants{};
  int trainer_id = 0;
  bool trainer_state = false;  // also return the trainer's saved state
  bool describe_only = false;  // the header alone
  // The trainer's segment for a shared-memory reply; unset: a streamed reply.
  std::optional<v1::SharedMemory> shared_memory{};
};

// Who asks: for the log line of a restore that succeeded, and the trainer's process,
// whose segments a shared-memory reply or host_memory tensors are mapped from (each
// asked only when needed).
struct RestoreCaller {
  std::function<std::string()> describe{};
  std::function<absl::StatusOr<pid_t>()> pid{};
};

struct RestorerOptions {
  uint64_t max_index_bytes = uint64_t{1} << 30;
  // Threads one restore reads with: enough to keep a disk's queue busy.
  int read_threads = 4;
  // Write a local trainer's restores into its own memory where it names it and the
  // kernel allows (TrainerMemory); false: always through its segment.
  bool process_memory = true;
};

// The largest tensor (box bytes) a restore writes into a trainer's own memory; a
// restore with a larger one uses the trainer's segment.
inline constexpr int64_t kMaxTrainerMemoryItem = int64_t{64} << 20;

// A restore's replies with every chunk written into the trainer's memory instead of
// sent: tensor i's chunks go to (*ranges)[i], laid end to end. Headers, trailers and
// RestoreReady messages go on to `replies`. Borrows everything; one thread at a time.
class TrainerMemorySink : public RestoreSink {
 public:
  TrainerMemorySink(const TrainerMemory* memory, const std::vector<std::vector<AddressRange>>* ranges,
                    RestoreSink* replies);
  absl::Status Send(const v1::RestoreResponse& message) override;
  absl::Status SendChunk(int32_t tensor_index, int64_t offset, absl::Span<const char> data) override;

 private:
  const TrainerMemory* memory_;
  const std::vector<std::vector<AddressRange>>* ranges_;
  RestoreSink* replies_;
};

class Restorer {
 public:
  // `segments` is shared with the Save path (a trainer's next call reuses a mapping);
  // `metrics` may be null.
  Restorer(RestorerOptions options, StorageTiers* tiers, StepRegistry* registry, StagingArea* staging,
           DeviceStager* device, SharedSegmentCache* segments, Metrics* metrics)
      : options_(options),
        tiers_(tiers),
        registry_(registry),
        staging_(staging),
        device_(device),
        segments_(segments),
        metrics_(metrics) {}

  // Restores `call` into `sink`, within `deadline`. With fallback, a step whose bytes
  // fail verification is skipped for the next older one and nothing is sent before a
  // step reads cleanly; a step the root cannot give whole is read from the drain when
  // it holds the step. The status says why nothing (or not everything) was restored.
  absl::Status Restore(const RestoreCall& call, const RestoreCaller& caller, absl::Time deadline,
                       RestoreSink* sink);

  // Since start: bytes received from peers, and bytes delivered to trainers.
  uint64_t peer_bytes_received() const { return peer_bytes_.load(); }
  uint64_t bytes_delivered() const { return bytes_delivered_.load(); }

 private:
  // One candidate step: plan, read (verifying), then send. DATA_LOSS before anything
  // was sent, so that fallback can try an older step. `note` says what was skipped.
  // With `last_candidate`, no fallback and no device memory, the header goes first: a
  // streamed reply sends each group of tensors while the next is read (see
  // ReadAndStream), a shared-memory one names tensors as they land (RestoreReady).
  absl::Status RestoreStep(const RestoreCall& call, const RestoreSource& source, std::string note,
                           const RestoreCaller& caller, absl::Time deadline, bool last_candidate,
                           RestoreSink* sink);
  // Reads the plan into `out` and sends the reply: the header first when streaming or
  // announcing while reading, else after every byte was read and verified.
  absl::Status ReadAndSend(const RestoreCall& call, BundleReader& reader, const RestorePlan& plan,
                           const StorageTiers::StepReads& reads, v1::RestoreResponse& header_message,
                           bool stream_while_reading, bool announce_while_reading, absl::Time deadline,
                           RestoreOutputs& out, RestoreSink* sink);
  // The trainer's memory when this restore goes straight into it: it named its own
  // memory for every tensor, sent a segment (so it runs on this host), the reply is
  // sent while it is read (`send_header_first`), no tensor is bound for host_memory or
  // larger than kMaxTrainerMemoryItem, and the kernel lets this daemon write there. Null otherwise (the reply
  // then uses the segment); INVALID_ARGUMENT when a tensor's ranges do not add up to its bytes or are not
  // mapped in the trainer.
  absl::StatusOr<std::unique_ptr<TrainerMemory>> OpenTrainerMemory(const RestoreCall& call,
                                                                   const RestoreCaller& caller,
                                                                   const RestorePlan& plan,
                                                                   bool send_header_first);
  // The trainer's segment for a shared-memory reply (null for a streamed one),
  // INVALID_ARGUMENT when it is smaller than the plan needs.
  absl::StatusOr<std::shared_ptr<SharedSegment>> MapReplySegment(const RestoreCall& call,
                                                                 const RestoreCaller& caller,
                                                                 const RestorePlan& plan);
  // The trainer's segment ranges that items asking for host_memory go straight into
  // (null for the others); INVALID_ARGUMENT when a range's size is not the item's.
  absl::StatusOr<std::vector<std::shared_ptr<SharedSegment>>> MapHostMemory(const RestoreCaller& caller,
                                                                            const RestorePlan& plan,
                                                                            const RestoreWants& wants);
  // With local storage and no peer channel: FAILED_PRECONDITION naming the ranks and
  // hosts whose shards a restore needs when they are not on this host.
  absl::Status CheckShardsHere(const BundleReader& reader, const std::string& step_dir) const;
  // The log line, the counters, and per-tensor debug lines of a restore that succeeded.
  void Record(const RestoreCall& call, const RestorePlan& plan, int64_t step, const RestoreCaller& caller,
              const StorageTiers::StepReads& reads, const char* delivery, int64_t delivered,
              absl::Time started);

  const RestorerOptions options_;
  StorageTiers* tiers_;
  StepRegistry* registry_;
  StagingArea* staging_;
  DeviceStager* device_;
  SharedSegmentCache* segments_;
  Metrics* metrics_;
  std::atomic<uint64_t> peer_bytes_{0};
  std::atomic<uint64_t> bytes_delivered_{0};
  std::atomic<bool> told_no_process_memory_{false};  // logged once per daemon
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_RESTORE_RESTORER_H_
