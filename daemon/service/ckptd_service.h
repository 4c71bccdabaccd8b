// The gRPC service. Save, Restore, ListCheckpoints, ListTensors and Status run on gRPC's sync
// thread pool and touch only memory and the files of their own request; Wait and
// Barrier are callback handlers that register a waiter and return at once, completed
// later by the coordinator. The one place where a Status becomes a grpc::Status.
#ifndef CKPTD_DAEMON_SERVICE_CKPTD_SERVICE_H_
#define CKPTD_DAEMON_SERVICE_CKPTD_SERVICE_H_

#include <grpcpp/support/server_interceptor.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "ckptd/v1/ckptd.grpc.pb.h"
#include "daemon/base/metrics.h"
#include "daemon/coord/memory_tier.h"
#include "daemon/coord/step_registry.h"
#include "daemon/io/read_cache.h"
#include "daemon/restore/restore_plan.h"
#include "daemon/service/local_listener.h"
#include "daemon/service/peer.h"
#include "daemon/service/restore_reply.h"
#include "daemon/service/validation.h"
#include "daemon/staging/device_stager.h"
#include "daemon/staging/shared_segment.h"
#include "daemon/staging/staging_area.h"
#include "daemon/store/checkpoint_store.h"

namespace ckptd {

grpc::Status ToGrpcStatus(const absl::Status& status);

// gRPC answers a request that does not parse with INTERNAL and an empty message
// before any handler runs; this interceptor turns that into INVALID_ARGUMENT naming
// the method, so a client learns its request was malformed.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewParseErrorInterceptorFactory();

struct ServiceContext {
  int rank = 0;
  int num_ranks = 1;
  std::string version;
  uint64_t max_index_bytes = 1ull << 30;
  int64_t max_tensors_per_request = 100000;
  int64_t max_request_bytes = int64_t{64} << 30;
  int max_trainers = 16384;
  std::string tcp_address;     // filled in once the TCP listener is up
  bool local_storage = false;  // storage: local (this host holds its own shard only)
  // With local storage and a TCP listener: where the other hosts' daemons are (set at
  // start-up); reads of their shards end within peer_timeout or the call's deadline.
  PeerDirectory* peer_directory = nullptr;
  absl::Duration peer_timeout = absl::Minutes(1);
  // The drain root (config drain_to), or null: restores fall back to it.
  const CheckpointStore* drain_store = nullptr;
  // Restores read through `read_cache` (blocks shared with the host's other restores
  // and with the other daemons' peer reads) from `storage`, the file system beneath
  // the store's; both null: the store's file system, uncached.
  FileSystem* storage = nullptr;
  ReadCache* read_cache = nullptr;
  // read_once: each data file of a step is read from storage by one daemon (its
  // writer's host, or on a shared root the rank that wrote it) and sent to the
  // others over the peer channel.
  bool read_once = false;
  // Counters and histograms for /metrics (config metrics_address); null: none kept.
  Metrics* metrics = nullptr;
};

class CkptdService final
    : public v1::Ckptd::WithCallbackMethod_Wait<v1::Ckptd::WithCallbackMethod_Barrier<v1::Ckptd::Service>> {
 public:
  CkptdService(ServiceContext context, StepRegistry* registry, CheckpointStore* store, StagingArea* staging,
               const PeerTable* peers)
      : context_(std::move(context)),
        registry_(registry),
        store_(store),
        staging_(staging),
        peers_(peers),
        device_(DeviceStager::Create()) {
    ServeRestoreAsBytes();
  }

  // What device memory this daemon can take (for the start-up log).
  std::string DeviceDescription() const { return device_->Describe(); }

  void set_tcp_address(const std::string& address) { context_.tcp_address = address; }
  void set_metrics_address(const std::string& address) { metrics_address_ = address; }
  // memory_steps: reported by Status. Set before serving.
  void set_memory_tier(const MemoryTier* tier) { memory_tier_ = tier; }

  // This daemon's own status, without the other ranks'. Thread-safe.
  v1::StatusResponse LocalStatus() const;
  // The /metrics page: every counter and histogram, and this daemon's gauges now.
  std::string MetricsText() const;

  // After this, new Saves are refused with UNAVAILABLE.
  void StopAccepting() { accepting_ = false; }

  grpc::Status Save(grpc::ServerContext* ctx, grpc::ServerReader<v1::SaveRequest>* reader,
                    v1::SaveResponse* response) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx, const v1::StepRef* request,
                                 v1::WaitResponse* response) override;
  // Restore is served through gRPC's split-streaming handler, which reads the request
  // in the handler and writes raw ByteBuffers (restore_reply.h); the constructor
  // installs it in place of the generated one.
  grpc::Status StreamedRestore(grpc::ServerContext* ctx, RestoreStream* stream);
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* ctx, const v1::BarrierRequest* request,
                                    v1::BarrierResponse* response) override;
  grpc::Status ListCheckpoints(grpc::ServerContext* ctx, const v1::ListCheckpointsRequest* request,
                               v1::ListCheckpointsResponse* response) override;
  grpc::Status ListTensors(grpc::ServerContext* ctx, const v1::ListTensorsRequest* request,
                           v1::ListTensorsResponse* response) override;
  grpc::Status ReadStepFile(grpc::ServerContext* ctx, const v1::ReadStepFileRequest* request,
                            grpc::ServerWriter<v1::ReadStepFileResponse>* writer) override;
  grpc::Status Status(grpc::ServerContext* ctx, const v1::StatusRequest* request,
                      v1::StatusResponse* response) override;

 private:
  // Installs StreamedRestore as Restore's handler.
  void ServeRestoreAsBytes();
  // INVALID_ARGUMENT past limits.max_trainers.
  // Where each planned tensor lands: the trainer's segment, or staging memory on its
  // way to the device or to the stream after the header. Staging memory, because it
  // counts against the daemon's budget and its pool hands back pages already touched
  // (fresh pages would be faulted in at a fraction of memcpy speed).
  struct RestoreOutputs {
    std::vector<char*> destinations;                          // one per plan item, for ReadPlan
    std::vector<StagedBuffer> streamed;                       // unallocated where the bytes go elsewhere
    std::vector<StagedBuffer> device_buffers;                 // unallocated where not for a device
    std::vector<std::shared_ptr<SharedSegment>> host_memory;  // null where not for host memory
    // Streamed items sent straight from bytes kept in memory (ReadAndStream); empty
    // spans for the others, which go through `streamed`.
    std::vector<absl::Span<const char>> kept;
  };
  // The trainer's segment ranges that items asking for host_memory go straight into
  // (null for the others); INVALID_ARGUMENT when a range's size is not the item's.
  absl::StatusOr<std::vector<std::shared_ptr<SharedSegment>>> MapHostMemory(const std::string& peer,
                                                                            const RestorePlan& plan,
                                                                            const RestoreWants& wants);
  // With `defer_streamed`, streamed items get no buffer yet (ReadAndStream allocates
  // each group's as it reads it, so a streamed restore holds about two groups at once).
  absl::StatusOr<RestoreOutputs> PrepareOutputs(const RestorePlan& plan, const RestoreWants& wants,
                                                const std::shared_ptr<SharedSegment>& mapped,
                                                std::vector<std::shared_ptr<SharedSegment>> host_memory,
                                                absl::Time deadline, bool defer_streamed);
  // Staging buffers for streamed items [begin, end), waiting for room until `deadline`;
  // none for items sent from out.kept.
  absl::Status AllocateStreamed(const RestorePlan& plan, size_t begin, size_t end, absl::Time deadline,
                                RestoreOutputs& out);
  // The trainer's segment for a shared-memory reply (null for a streamed one),
  // INVALID_ARGUMENT when it is smaller than the plan needs.
  absl::StatusOr<std::shared_ptr<SharedSegment>> MapReplySegment(const std::string& peer,
                                                                 const v1::RestoreRequest& request,
                                                                 const RestorePlan& plan);
  absl::Status CheckTrainerCount(int trainer_count) const;
  // RESOURCE_EXHAUSTED past limits.max_tensors_per_request.
  absl::Status CheckTensorCount(int count) const;
  // The bytes `tensors` declare; RESOURCE_EXHAUSTED past limits.max_request_bytes or
  // what staging can ever hold.
  absl::StatusOr<int64_t> CheckSaveSize(const std::vector<CheckedTensor>& tensors) const;
  // The trainer's shared-memory segment when the header names one (null otherwise),
  // its size checked against the host tensors; and FAILED_PRECONDITION/UNIMPLEMENTED
  // when tensors lie in device memory this daemon cannot take.
  absl::StatusOr<std::shared_ptr<SharedSegment>> MapTrainerSegment(const std::string& peer,
                                                                   const v1::SaveHeader& header,
                                                                   const std::vector<CheckedTensor>& tensors);
  // With local storage: FAILED_PRECONDITION naming the ranks and hosts whose shards a
  // restore needs when they are not on this host (peer reads are not implemented).
  absl::Status CheckShardsHere(const BundleReader& reader, const std::string& step_dir) const;
  absl::Status DoReadStepFile(const v1::ReadStepFileRequest& request, absl::Time deadline,
                              grpc::ServerWriter<v1::ReadStepFileResponse>* writer);
  // The file systems one read of a step goes through, built per call so that it
  // counts its own bytes: the read cache over storage, the memory tier, and (with
  // known peers, on local disks or with read_once) other daemons.
  struct ReadStack {
    ReadCounts counts;
    // What the restore will read; the cache keeps blocks for it only where another
    // reader wants them (outlives `cached`, whose files point at it).
    ReadCache::Interest interest;
    std::optional<CachingFileSystem> cached;
    std::optional<MemoryTierFileSystem> memory;
    std::optional<PeerFileSystem> peers;
    FileSystem* top = nullptr;
  };
  // Builds *stack for reading `step` of `run` (within `deadline`) and returns its top.
  // With `keep_all`, the read cache keeps every block read; otherwise only those
  // another declared reader wants (see ReadCache::Read; stack->interest declares).
  FileSystem* StepFileSystem(const std::string& run, int64_t step, absl::Time deadline, bool keep_all,
                             ReadStack* stack) const;
  // Whether restores read other hosts' data files through their daemons (local
  // storage, or read_once); then those daemons read this host's files through this one.
  bool ReadsThroughPeers() const;
  absl::Status DoListTensors(const v1::ListTensorsRequest& request, v1::ListTensorsResponse* response);
  absl::Status DoSave(grpc::ServerContext* ctx, grpc::ServerReader<v1::SaveRequest>* reader,
                      v1::SaveResponse* response);
  // Receives the data chunks after a validated header into staged buffers.
  absl::StatusOr<TrainerPayload> ReceiveData(grpc::ServerContext* ctx,
                                             grpc::ServerReader<v1::SaveRequest>* reader,
                                             const v1::SaveHeader& header, const Placement& placement,
                                             const std::vector<CheckedTensor>& tensors,
                                             const std::shared_ptr<SharedSegment>& mapped);
  absl::Status DoRestore(const v1::RestoreRequest& request, const std::string& peer, absl::Time deadline,
                         RestoreStream* writer);
  // A step a restore may read, and where: the checkpoint root or the drain.
  struct RestoreSource {
    int64_t step = 0;
    const CheckpointStore* store = nullptr;
    bool drained = false;
  };
  // What DoRestore tries, in order: the step asked for (or the newest, and with
  // `fallback` every older one), each from the checkpoint root first and then from the
  // drain. NOT_FOUND when neither holds a committed step; DATA_LOSS naming what is
  // missing when the step asked for, or without `fallback` the newest step, was lost
  // (CheckpointStore::MarkLost); with `fallback`, *note says which lost steps it passed.
  absl::StatusOr<std::vector<RestoreSource>> RestoreSources(const std::string& run,
                                                            std::optional<int64_t> step, bool fallback,
                                                            std::string* note) const;
  // One candidate step: plan, read (verifying), then send. DATA_LOSS before anything
  // was sent, so that fallback can try an older step. `note` says what was skipped.
  // With `last_candidate`, no fallback and no device memory, the header goes first: a
  // streamed reply sends each group of tensors while the next is read (see
  // ReadAndStream), a shared-memory one names tensors as they land (RestoreReady).
  absl::Status RestoreStep(const v1::RestoreRequest& request, const RestoreWants& wants,
                           const Placement& placement, const RestoreSource& source, std::string note,
                           const std::string& peer, absl::Time deadline, bool last_candidate,
                           RestoreStream* writer);
  // Reads the plan's items in groups of about 64 MiB, each into staging buffers it
  // allocates then, and sends each group's chunks while the next group is read: the
  // transfer overlaps the reads instead of following them. Items that are whole
  // entries kept in memory (the memory tier) are sent from there, with no copy into
  // staging. A failed read stops the stream there. The header must already be sent;
  // `out` from PrepareOutputs with defer_streamed.
  absl::Status ReadAndStream(BundleReader& reader, const RestorePlan& plan, absl::Time deadline,
                             RestoreOutputs& out, RestoreStream* writer);
  static v1::RestoreHeader RestoreHeaderFor(const RestorePlan& plan, const RestoreWants& wants, int64_t step,
                                            const std::string& note);
  // Sends items [begin, end) as chunks: from out.kept[i] where it is set, else from
  // out.streamed[i], freeing each staging buffer once sent.
  static absl::Status SendChunks(RestoreOutputs& out, size_t begin, size_t end, RestoreStream* writer);

  ServiceContext context_;
  StepRegistry* registry_;
  CheckpointStore* store_;
  StagingArea* staging_;
  const PeerTable* peers_;
  std::unique_ptr<DeviceStager> device_;
  std::atomic<bool> accepting_{true};
  std::string metrics_address_;  // where /metrics is served, if anywhere
  const MemoryTier* memory_tier_ = nullptr;
  // Saves' and restores' mappings of trainer segments, reused by a trainer's next call.
  SharedSegmentCache segments_;
  // Since start, for Status: bytes restores received from peers and delivered to
  // trainers (storage bytes are the read cache's own total).
  std::atomic<uint64_t> restore_peer_bytes_{0};
  std::atomic<uint64_t> restore_bytes_delivered_{0};
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_SERVICE_CKPTD_SERVICE_H_
