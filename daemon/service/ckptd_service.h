// The gRPC service: it translates. Requests are validated into internal values and
// handed to the StepRegistry (Save, Wait, Barrier), the Restorer (Restore) or the
// stores (listings, ReadStepFile); results and Statuses go back as protos and
// grpc::Statuses. Save, Restore, ListCheckpoints, ListTensors and Status run on
// gRPC's sync thread pool and touch only memory and the files of their own request;
// Wait and Barrier are callback handlers that register a waiter and return at once,
// completed later by the coordinator. The one place where a Status becomes a
// grpc::Status.
#ifndef CKPTD_DAEMON_SERVICE_CKPTD_SERVICE_H_
#define CKPTD_DAEMON_SERVICE_CKPTD_SERVICE_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "ckptd/v1/ckptd.grpc.pb.h"
#include "daemon/base/metrics.h"
#include "daemon/config/config.h"
#include "daemon/coord/step_registry.h"
#include "daemon/restore/restorer.h"
#include "daemon/service/free_space.h"
#include "daemon/service/grpc_status.h"
#include "daemon/service/local_listener.h"
#include "daemon/service/restore_reply.h"
#include "daemon/service/status_report.h"
#include "daemon/service/validation.h"
#include "daemon/staging/device_stager.h"
#include "daemon/staging/shared_segment.h"
#include "daemon/staging/staging_area.h"
#include "daemon/store/checkpoint_store.h"
#include "daemon/tiers/storage_tiers.h"

namespace ckptd {

struct ServiceContext {
  int rank = 0;
  int num_ranks = 1;
  std::string version{};
  // The request limits (config limits.*): DaemonConfig's defaults.
  uint64_t max_index_bytes = DaemonConfig{}.max_index_bytes;
  int64_t max_tensors_per_request = DaemonConfig{}.max_tensors_per_request;
  int64_t max_request_bytes = DaemonConfig{}.max_request_bytes;
  int max_trainers = DaemonConfig{}.max_trainers;
  bool restore_into_trainer_memory = DaemonConfig{}.restore_into_trainer_memory;
  std::string tcp_address{};  // filled in once the TCP listener is up
  // Counters and histograms for /metrics (config metrics_address); null: none kept.
  Metrics* metrics = nullptr;
};

class CkptdService final
    : public v1::Ckptd::WithCallbackMethod_Wait<v1::Ckptd::WithCallbackMethod_Barrier<v1::Ckptd::Service>> {
 public:
  // Reads and restores go through `tiers`, which must outlive the service.
  CkptdService(ServiceContext context, StepRegistry* registry, StorageTiers* tiers, StagingArea* staging,
               const PeerTable* peers);

  // What device memory this daemon can take (for the start-up log).
  std::string DeviceDescription() const { return device_->Describe(); }

  void set_tcp_address(const std::string& address) { context_.tcp_address = address; }
  void set_metrics_address(const std::string& address) { metrics_address_ = address; }

  // This daemon's own status, without the other ranks'. Thread-safe.
  v1::StatusResponse LocalStatus() const;
  // The /metrics page: every counter and histogram, and this daemon's gauges now.
  std::string MetricsText() const;

  // After this, new Saves are refused with UNAVAILABLE.
  void StopAccepting() { accepting_ = false; }

  grpc::Status Save(grpc::ServerContext* ctx, grpc::ServerReader<v1::SaveRequest>* reader,
                    v1::SaveResponse* response) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx, const v1::WaitRequest* request,
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
  absl::Status CheckTrainerCount(int trainer_count) const;
  // RESOURCE_EXHAUSTED past limits.max_tensors_per_request.
  absl::Status CheckTensorCount(int count) const;
  // The trainer's shared-memory segment when the header names one (null otherwise),
  // its size checked against the host tensors; and FAILED_PRECONDITION/UNIMPLEMENTED
  // when tensors lie in device memory this daemon cannot take.
  absl::StatusOr<std::shared_ptr<SharedSegment>> MapTrainerSegment(const std::string& peer,
                                                                   const v1::SaveHeader& header,
                                                                   const std::vector<CheckedTensor>& tensors);
  absl::Status DoReadStepFile(const v1::ReadStepFileRequest& request, absl::Time deadline,
                              grpc::ServerWriter<v1::ReadStepFileResponse>* writer);
  absl::Status DoListTensors(const v1::ListTensorsRequest& request, v1::ListTensorsResponse* response);
  absl::Status DoSave(grpc::ServerContext* ctx, grpc::ServerReader<v1::SaveRequest>* reader,
                      v1::SaveResponse* response);
  // Receives the data chunks after a validated header into staged buffers.
  absl::StatusOr<TrainerPayload> ReceiveData(grpc::ServerContext* ctx,
                                             grpc::ServerReader<v1::SaveRequest>* reader,
                                             const v1::SaveHeader& header, const Placement& placement,
                                             const std::vector<CheckedTensor>& tensors,
                                             const std::shared_ptr<SharedSegment>& mapped);
  // Validates the request and hands it to the restorer, whose replies go out on `writer`.
  absl::Status DoRestore(const v1::RestoreRequest& request, const std::string& peer, absl::Time deadline,
                         RestoreStream* writer);
  ServiceContext context_;
  StepRegistry* registry_;
  StorageTiers* tiers_;
  CheckpointStore* store_;  // tiers_->read_store()
  FreeSpaceMonitor root_free_space_;
  StagingArea* staging_;
  const PeerTable* peers_;
  std::unique_ptr<DeviceStager> device_;
  std::atomic<bool> accepting_{true};
  std::string metrics_address_;  // where /metrics is served, if anywhere
  const absl::Time started_ = absl::Now();
  // Saves' and restores' mappings of trainer segments, reused by a trainer's next call.
  SharedSegmentCache segments_;
  Restorer restorer_;
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_SERVICE_CKPTD_SERVICE_H_
