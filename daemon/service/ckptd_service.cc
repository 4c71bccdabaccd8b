#include "daemon/service/ckptd_service.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <set>
#include <thread>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/v1/wire.h"
#include "daemon/base/dtype.h"
#include "daemon/base/logging.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/bundle/checkpoint_meta.h"
#include "daemon/io/direct_io_memory.h"
#include "daemon/layout/cast.h"
#include "daemon/restore/restore_plan.h"
#include "daemon/service/save_payload.h"
#include "daemon/service/validation.h"
#include "daemon/staging/shared_segment.h"

namespace ckptd {
namespace {

// ListTensors pages: a default and a cap on the count, and a byte budget that keeps
// a page inside gRPC's default 4 MiB receive limit whatever the names' lengths.
constexpr int kDefaultTensorPage = 1000;
constexpr int kMaxTensorPage = 10000;
constexpr size_t kTensorPageBytes = size_t{2} << 20;

}  // namespace

CkptdService::CkptdService(ServiceContext context, StepRegistry* registry, StorageTiers* tiers,
                           StagingArea* staging, const PeerTable* peers)
    : context_(std::move(context)),
      registry_(registry),
      tiers_(tiers),
      store_(tiers->read_store()),
      root_free_space_(store_->fs(), store_->root()),
      staging_(staging),
      peers_(peers),
      device_(DeviceStager::Create()),
      restorer_({.max_index_bytes = context_.max_index_bytes,
                 .process_memory = context_.restore_into_trainer_memory},
                tiers, registry, staging, device_.get(), &segments_, context_.metrics) {
  ServeRestoreAsBytes();
}

grpc::Status CkptdService::Save(grpc::ServerContext* ctx, grpc::ServerReader<v1::SaveRequest>* reader,
                                v1::SaveResponse* response) {
  absl::Status s = peers_->Check(ctx->peer());
  if (s.ok()) s = DoSave(ctx, reader, response);
  if (!s.ok()) spdlog::warn("Save from {}: {}", peers_->Describe(ctx->peer()), std::string(s.message()));
  if (!s.ok() && context_.metrics != nullptr) {
    context_.metrics->Count("ckptd_save_failures_total", {{"code", absl::StatusCodeToString(s.code())}});
  }
  return ToGrpcStatus(s);
}

absl::Status CkptdService::CheckTrainerCount(int trainer_count) const {
  if (trainer_count > context_.max_trainers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer_count: ", trainer_count, " exceeds limits.max_trainers (", context_.max_trainers, ")"));
  }
  return absl::OkStatus();
}

absl::Status CkptdService::CheckTensorCount(int count) const {
  if (count <= context_.max_tensors_per_request) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("tensors: ", count,
                                                   " in one request exceed limits.max_tensors_per_request (",
                                                   context_.max_tensors_per_request, ")"));
}

absl::StatusOr<std::shared_ptr<SharedSegment>> CkptdService::MapTrainerSegment(
    const std::string& peer, const v1::SaveHeader& header, const std::vector<CheckedTensor>& tensors) {
  // Device memory this daemon cannot take is refused here too, before the step counts
  // on this trainer, so a client can fall back to host memory.
  int64_t host_bytes = 0;
  bool any_on_device = false;
  for (const CheckedTensor& t : tensors) {
    any_on_device |= t.device_memory.has_value();
    if (!t.device_memory.has_value()) host_bytes += t.bytes;
  }
  if (any_on_device) RETURN_IF_ERROR(device_->Available());
  if (!header.has_shared_memory()) return nullptr;
  ASSIGN_OR_RETURN(pid_t pid, peers_->LocalPid(peer));
  const v1::SharedMemory& shm = header.shared_memory();
  if (shm.size() != host_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("shared_memory.size: ", shm.size(),
                                                   " bytes, but the descriptors need ", host_bytes,
                                                   " (tensors in device memory excluded)"));
  }
  return segments_.Open(pid, shm.fd(), shm.offset(), shm.size(), SharedSegment::Access::kRead);
}

absl::Status CkptdService::DoSave(grpc::ServerContext* ctx, grpc::ServerReader<v1::SaveRequest>* reader,
                                  v1::SaveResponse* response) {
  if (!accepting_) return absl::UnavailableError("ckptd is shutting down");
  const absl::Time started = absl::Now();
  v1::SaveRequest message;
  if (!reader->Read(&message) || !message.has_header()) {
    // gRPC drops a message that does not parse (proto3 refuses a string field that is
    // not UTF-8) as if the stream had ended, so both cases land here.
    return absl::InvalidArgumentError(
        "header: the first message of a Save stream must be a header that parses (string fields such as run "
        "and tensor names must be valid UTF-8)");
  }
  const v1::SaveHeader& header = message.header();  // no copy: `message` outlives every use
  RETURN_IF_ERROR(CheckTrainerCount(header.trainer_count()));
  ASSIGN_OR_RETURN(Placement placement, ValidatePlacement(header.mesh(), header.device_ids()));
  RETURN_IF_ERROR(CheckTensorCount(header.tensors_size()));
  std::vector<CheckedTensor> tensors;
  RETURN_IF_ERROR(ValidateSaveHeader(header, placement, &tensors));
  ASSIGN_OR_RETURN(const int64_t declared,
                   CheckSaveSize(tensors, context_.max_request_bytes, staging_->limit()));
  if (store_->IsCommitted(header.run(), header.step())) {
    return absl::AlreadyExistsError(
        absl::StrCat("run '", header.run(), "' step ", header.step(), " is already committed"));
  }
  const StepKey key{header.run(), header.step()};
  // A trainer arriving after its step failed hears why now, before sending any bytes.
  RETURN_IF_ERROR(registry_->Admit(key, header.trainer_id()));
  // A segment this daemon cannot map is refused before the step counts on this
  // trainer, so a client can fall back to streaming.
  ASSIGN_OR_RETURN(std::shared_ptr<SharedSegment> mapped, MapTrainerSegment(ctx->peer(), header, tensors));
  absl::StatusOr<TrainerPayload> payload = ReceiveData(ctx, reader, header, placement, tensors, mapped);
  if (!payload.ok()) {
    // The trainer was part of this step: without its bytes the step cannot commit, so
    // it fails for every trainer now rather than at the deadline. Staged memory for
    // it is freed.
    registry_->FailStaging(
        key, header.trainer_id(),
        absl::Status(payload.status().code(),
                     absl::StrCat("trainer ", header.trainer_id(), " on host ", HostName(), " (rank ",
                                  context_.rank, "): its Save broke off: ", payload.status().message())));
    return payload.status();
  }
  RETURN_IF_ERROR(registry_->Stage(key, header.trainer_count(), std::move(*payload)));
  response->set_bytes_staged(declared);
  response->set_staging_seconds(absl::ToDoubleSeconds(absl::Now() - started));
  if (context_.metrics != nullptr) {
    context_.metrics->Count("ckptd_saves_total", {{"run", header.run()}});
    context_.metrics->Count("ckptd_staged_bytes_total", {{"run", header.run()}},
                            static_cast<double>(declared));
    context_.metrics->Observe("ckptd_save_staging_seconds", {}, response->staging_seconds());
  }
  LogEvent(spdlog::level::debug,
           {.run = header.run(),
            .step = header.step(),
            .trainer = header.trainer_id(),
            .bytes = declared,
            .seconds = response->staging_seconds()},
           "run '{}' step {}: staged trainer {} of {} from {}: {} tensor(s), {} bytes in {:.3f} s ({})",
           header.run(), header.step(), header.trainer_id(), header.trainer_count(),
           peers_->Describe(ctx->peer()), header.tensors_size(), declared, response->staging_seconds(),
           mapped != nullptr ? "shared memory" : "gRPC stream");
  return absl::OkStatus();
}

absl::StatusOr<TrainerPayload> CkptdService::ReceiveData(grpc::ServerContext* ctx,
                                                         grpc::ServerReader<v1::SaveRequest>* reader,
                                                         const v1::SaveHeader& header,
                                                         const Placement& placement,
                                                         const std::vector<CheckedTensor>& tensors,
                                                         const std::shared_ptr<SharedSegment>& mapped) {
  // When staging memory is full, wait for room as long as the caller's deadline allows.
  SavePayloadBuilder builder(staging_, device_.get(), tensors, absl::FromChrono(ctx->deadline()));
  v1::SaveRequest message;
  if (mapped != nullptr) {
    if (reader->Read(&message)) {
      return absl::InvalidArgumentError("data: a Save with shared_memory carries no data chunks");
    }
    RETURN_IF_ERROR(builder.BorrowFrom(mapped));
  } else {
    while (reader->Read(&message)) {
      if (!message.has_data() && message.has_header()) {
        return absl::InvalidArgumentError("header: a Save stream carries exactly one header");
      }
      RETURN_IF_ERROR(builder.AddChunk(message.data()));
    }
    RETURN_IF_ERROR(builder.EndOfStream());
  }
  RETURN_IF_ERROR(builder.CopyFromDevice());
  return builder.Build(header, placement);
}

grpc::ServerUnaryReactor* CkptdService::Wait(grpc::CallbackServerContext* ctx, const v1::WaitRequest* request,
                                             v1::WaitResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status allowed = peers_->Check(ctx->peer());
  if (absl::Status s = allowed.ok() ? ValidateRunName(request->run()) : allowed; !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  if (request->step() < 0) {
    reactor->Finish(
        ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat("step: ", request->step(), " is negative"))));
    return reactor;
  }
  const StepKey key{request->run(), request->step()};
  response->set_path(store_->StepDir(key.run, key.step));
  // Committed before this daemon started: the directory is the proof.
  if (!registry_->Outcome(key).has_value() && store_->IsCommitted(key.run, key.step)) {
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  // A name mistyped, or a watcher on the wrong daemon, would otherwise wait out its
  // whole deadline for a step that nothing will ever save.
  if (!request->allow_unknown_run() && !registry_->KnowsRun(key.run) &&
      !store_->fs()->IsDirectory(store_->RunDir(key.run))) {
    reactor->Finish(ToGrpcStatus(absl::NotFoundError(
        absl::StrCat("run '", key.run, "': this daemon has no step of it (none staged, committing or under ",
                     store_->root(),
                     "); check the name, or wait with allow_unknown_run (ckptctl wait --allow-unknown) "
                     "for a run about to start"))));
    return reactor;
  }
  registry_->AddStepWaiter(key,
                           Waiter{[ctx] { return ctx->IsCancelled(); },
                                  [reactor](const absl::Status& s) { reactor->Finish(ToGrpcStatus(s)); }});
  return reactor;
}

grpc::ServerUnaryReactor* CkptdService::Barrier(grpc::CallbackServerContext* ctx,
                                                const v1::BarrierRequest* request,
                                                v1::BarrierResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s = peers_->Check(ctx->peer());
  if (s.ok()) s = ValidateRunName(request->run());
  if (s.ok()) s = CheckTrainerCount(request->trainer_count());
  if (s.ok() && (request->trainer_count() < 1 || request->trainer_id() < 0 ||
                 request->trainer_id() >= request->trainer_count())) {
    s = absl::InvalidArgumentError("trainer_id: must lie in [0, trainer_count) with trainer_count >= 1");
  }
  absl::StatusOr<Placement> placement = ValidatePlacement(request->mesh(), request->device_ids());
  if (s.ok() && !placement.ok()) s = placement.status();
  if (!s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  const int64_t mesh_size = placement->mesh.has_value() ? placement->mesh->size() : 0;
  registry_->AddBarrierWaiter(
      request->run(), request->barrier_id(), request->trainer_id(), request->trainer_count(),
      static_cast<int64_t>(placement->device_ids.size()), mesh_size,
      Waiter{[ctx] { return ctx->IsCancelled(); },
             [reactor](const absl::Status& st) { reactor->Finish(ToGrpcStatus(st)); }});
  return reactor;
}

void CkptdService::ServeRestoreAsBytes() {
  const google::protobuf::MethodDescriptor* method =
      v1::RestoreRequest::descriptor()->file()->FindServiceByName("Ckptd")->FindMethodByName("Restore");
  // The generated service registers its methods in the proto's order.
  MarkMethodStreamed(
      method->index(),
      new grpc::internal::SplitServerStreamingHandler<v1::RestoreRequest, grpc::ByteBuffer>(
          [this](grpc::ServerContext* ctx, RestoreStream* stream) { return StreamedRestore(ctx, stream); }));
}

grpc::Status CkptdService::StreamedRestore(grpc::ServerContext* ctx, RestoreStream* stream) {
  absl::Status s = peers_->Check(ctx->peer());
  v1::RestoreRequest request;
  if (s.ok() && !stream->Read(&request)) {
    // As ParseErrorInterceptor answers for the other methods, whose requests gRPC reads.
    s = absl::InvalidArgumentError(UnparsedRequestError("/ckptd.v1.Ckptd/Restore"));
  }
  if (s.ok()) s = DoRestore(request, ctx->peer(), absl::FromChrono(ctx->deadline()), stream);
  if (!s.ok()) spdlog::warn("Restore from {}: {}", peers_->Describe(ctx->peer()), std::string(s.message()));
  if (!s.ok() && context_.metrics != nullptr) {
    context_.metrics->Count("ckptd_restore_failures_total", {{"code", absl::StatusCodeToString(s.code())}});
  }
  return ToGrpcStatus(s);
}

namespace {

// Carries a restore's replies on the gRPC stream, as raw bytes (restore_reply.h).
class GrpcRestoreSink final : public RestoreSink {
 public:
  explicit GrpcRestoreSink(RestoreStream* stream) : stream_(stream) {}
  absl::Status Send(const v1::RestoreResponse& message) override {
    ASSIGN_OR_RETURN(grpc::ByteBuffer bytes, EncodeRestoreResponse(message));
    return Write(bytes);
  }
  absl::Status SendChunk(int32_t tensor_index, int64_t offset, absl::Span<const char> data) override {
    return Write(EncodeRestoreChunk(tensor_index, offset, data));
  }

 private:
  absl::Status Write(const grpc::ByteBuffer& bytes) {
    return stream_->Write(bytes) ? absl::OkStatus() : absl::CancelledError("client went away");
  }
  RestoreStream* stream_;
};

}  // namespace

absl::Status CkptdService::DoRestore(const v1::RestoreRequest& request, const std::string& peer,
                                     absl::Time deadline, RestoreStream* writer) {
  RETURN_IF_ERROR(ValidateRunName(request.run()));
  RestoreCall call{.run = request.run(),
                   .step = request.latest() ? std::nullopt : std::optional<int64_t>(request.step()),
                   .fallback = request.fallback(),
                   .trainer_id = request.trainer_id(),
                   .trainer_state = request.trainer_state(),
                   .describe_only = request.describe_only()};
  ASSIGN_OR_RETURN(call.placement, ValidatePlacement(request.mesh(), request.device_ids()));
  RETURN_IF_ERROR(CheckTensorCount(request.tensors_size()));
  ASSIGN_OR_RETURN(call.wants, RestoreWantsFromProto(request));
  if (request.has_shared_memory()) call.shared_memory = request.shared_memory();
  const RestoreCaller caller{.describe = [this, &peer] { return peers_->Describe(peer); },
                             .pid = [this, &peer] { return peers_->LocalPid(peer); }};
  GrpcRestoreSink sink(writer);
  return restorer_.Restore(call, caller, deadline, &sink);
}

grpc::Status CkptdService::ListCheckpoints(grpc::ServerContext* ctx,
                                           const v1::ListCheckpointsRequest* request,
                                           v1::ListCheckpointsResponse* response) {
  if (absl::Status s = peers_->Check(ctx->peer()); !s.ok()) return ToGrpcStatus(s);
  std::vector<std::string> runs;
  if (!request->run().empty()) {
    if (absl::Status s = ValidateRunName(request->run()); !s.ok()) return ToGrpcStatus(s);
    runs.push_back(request->run());
  } else {
    absl::StatusOr<std::vector<std::string>> all = store_->ListRuns();
    if (!all.ok()) return ToGrpcStatus(all.status());
    runs = *all;
  }
  for (const std::string& run : runs) {
    absl::StatusOr<std::vector<int64_t>> steps = store_->ListSteps(run);
    if (!steps.ok()) return ToGrpcStatus(steps.status());
    for (int64_t step : *steps) {
      v1::CheckpointInfo* info = response->add_checkpoints();
      info->set_run(run);
      info->set_step(step);
      info->set_path(store_->StepDir(run, step));
      info->set_bytes(store_->StepBytes(run, step));
    }
  }
  return grpc::Status::OK;
}

grpc::Status CkptdService::ListTensors(grpc::ServerContext* ctx, const v1::ListTensorsRequest* request,
                                       v1::ListTensorsResponse* response) {
  absl::Status s = peers_->Check(ctx->peer());
  if (s.ok()) s = DoListTensors(*request, response);
  return ToGrpcStatus(s);
}

grpc::Status CkptdService::ReadStepFile(grpc::ServerContext* ctx, const v1::ReadStepFileRequest* request,
                                        grpc::ServerWriter<v1::ReadStepFileResponse>* writer) {
  absl::Status s = peers_->Check(ctx->peer());
  if (s.ok()) s = DoReadStepFile(*request, absl::FromChrono(ctx->deadline()), writer);
  return ToGrpcStatus(s);
}

absl::Status CkptdService::DoReadStepFile(const v1::ReadStepFileRequest& request, absl::Time deadline,
                                          grpc::ServerWriter<v1::ReadStepFileResponse>* writer) {
  constexpr int64_t kMaxReadBytes = int64_t{64} << 20;
  RETURN_IF_ERROR(ValidateRunName(request.run()));
  int shard = 0, num_shards = 0;
  const bool data_file =
      request.file().find('/') == std::string::npos && ParseDataFileName(request.file(), &shard, &num_shards);
  const bool parity_file = request.file().find('/') == std::string::npos &&
                           ParseParityFileName(request.file(), &shard, &num_shards);
  if (!data_file && !parity_file && request.file() != "ckpt.index" && request.file() != kCheckpointMetaFile) {
    return absl::InvalidArgumentError(absl::StrCat(
        "file: '", request.file(), "' is not ckpt.index, ckptd.json or a data or parity file of a step"));
  }
  if (request.offset() < 0 || request.length() < 0 || request.length() > kMaxReadBytes) {
    return absl::InvalidArgumentError(absl::StrCat("offset, length: [", request.offset(), ", +",
                                                   request.length(), ") (at most ", kMaxReadBytes,
                                                   " bytes)"));
  }
  ASSIGN_OR_RETURN(bool committed, store_->Committed(request.run(), request.step()));
  if (!committed) {
    return absl::NotFoundError(
        absl::StrCat("run '", request.run(), "' has no committed step ", request.step()));
  }
  const StepRegistry::RestorePin pin(registry_, {request.run(), request.step()});
  // Another host's daemon asks, for its trainers: blocks are kept for the others.
  const std::unique_ptr<StorageTiers::StepReads> reads =
      tiers_->ForStep(request.run(), request.step(), deadline, /*keep_all=*/true);
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file,
                   reads->fs()->NewRandomAccessFile(
                       JoinPath(store_->StepDir(request.run(), request.step()), request.file())));
  return Annotate(SendFileRange(*file, request.offset(), request.length(), writer), request.file());
}

absl::Status CkptdService::DoListTensors(const v1::ListTensorsRequest& request,
                                         v1::ListTensorsResponse* response) {
  RETURN_IF_ERROR(ValidateRunName(request.run()));
  if (request.page_size() < 0 || request.page_size() > kMaxTensorPage) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: ", request.page_size(), " is not in 0..", kMaxTensorPage));
  }
  const int page_size = request.page_size() == 0 ? kDefaultTensorPage : request.page_size();
  const std::optional<int64_t> step =
      request.latest() ? std::nullopt : std::optional<int64_t>(request.step());
  ASSIGN_OR_RETURN(std::vector<int64_t> candidates, store_->RestoreCandidates(request.run(), step, false));
  const int64_t chosen = candidates.front();
  ASSIGN_OR_RETURN(
      std::unique_ptr<BundleReader> reader,
      BundleReader::Open(store_->fs(), CheckpointStore::Prefix(store_->StepDir(request.run(), chosen)),
                         context_.max_index_bytes));
  response->set_step(chosen);
  std::vector<std::string> names = reader->TensorNames();  // in key (byte) order
  std::erase_if(names, [](const std::string& n) { return absl::StartsWith(n, kReservedNamePrefix); });
  auto it = request.page_token().empty() ? names.begin()
                                         : std::upper_bound(names.begin(), names.end(), request.page_token());
  size_t page_bytes = 0;
  for (; it != names.end() && response->tensors_size() < page_size && page_bytes < kTensorPageBytes; ++it) {
    ASSIGN_OR_RETURN(TensorInfo info, reader->Lookup(*it));
    v1::TensorDescriptor* tensor = response->add_tensors();
    tensor->set_name(*it);
    tensor->set_dtype(info.dtype);
    tensor->mutable_shape()->Add(info.shape.begin(), info.shape.end());
    page_bytes += tensor->ByteSizeLong();
  }
  if (it != names.end()) response->set_next_page_token(response->tensors().rbegin()->name());
  return absl::OkStatus();
}

grpc::Status CkptdService::Status(grpc::ServerContext* ctx, const v1::StatusRequest* request,
                                  v1::StatusResponse* response) {
  if (absl::Status s = peers_->Check(ctx->peer()); !s.ok()) return ToGrpcStatus(s);
  *response = LocalStatus();
  auto [reports, when] = registry_->RankReports();
  for (const std::string& report : reports) {
    if (!response->add_ranks()->ParseFromString(report))
      return ToGrpcStatus(absl::InternalError("bad rank report"));
  }
  if (!reports.empty())
    response->set_ranks_as_of_unix_seconds(absl::ToDoubleSeconds(when - absl::UnixEpoch()));
  return grpc::Status::OK;
}

std::string CkptdService::MetricsText() const {
  if (context_.metrics == nullptr) return "";
  return context_.metrics->Render(StatusGauges(LocalStatus()));
}

v1::StatusResponse CkptdService::LocalStatus() const {
  return LocalStatusReport({.rank = context_.rank,
                            .num_ranks = context_.num_ranks,
                            .version = context_.version,
                            .tcp_address = context_.tcp_address,
                            .metrics_address = metrics_address_,
                            .started = started_,
                            .root_free_bytes = root_free_space_.bytes(),
                            .registry = registry_,
                            .tiers = tiers_,
                            .staging = staging_,
                            .device = device_.get(),
                            .restorer = &restorer_});
}

}  // namespace ckptd
