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

// Threads one Restore reads with: enough to keep a disk's queue busy.
constexpr size_t kRestoreReadThreads = 4;

// ListTensors pages: a default and a cap on the count, and a byte budget that keeps
// a page inside gRPC's default 4 MiB receive limit whatever the names' lengths.
constexpr int kDefaultTensorPage = 1000;
constexpr int kMaxTensorPage = 10000;
constexpr size_t kTensorPageBytes = size_t{2} << 20;

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering. The message travels as HTTP/2
  // metadata, which a client refuses past its limit (8 KiB by default), failing every
  // call on the connection: it is bounded here.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), BoundMessage(status.message()));
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

namespace {

// What a client is told when its request to `method` does not parse.
std::string UnparsedRequestError(const std::string& method) {
  return absl::StrCat("the request to ", method,
                      " does not parse as its protobuf message (string fields must be valid UTF-8)");
}

class ParseErrorInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit ParseErrorInterceptor(std::string method) : method_(std::move(method)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      // Every status of ours carries a message: an empty INTERNAL is gRPC's own
      // "could not deserialize the request".
      if (status.error_code() == grpc::StatusCode::INTERNAL && status.error_message().empty()) {
        methods->ModifySendStatus(
            grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, UnparsedRequestError(method_)));
      }
    }
    methods->Proceed();
  }

 private:
  std::string method_;
};

class ParseErrorInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new ParseErrorInterceptor(info->method());
  }
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewParseErrorInterceptorFactory() {
  return std::make_unique<ParseErrorInterceptorFactory>();
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

absl::StatusOr<int64_t> CkptdService::CheckSaveSize(const std::vector<CheckedTensor>& tensors) const {
  int64_t declared = 0;
  for (const CheckedTensor& t : tensors) {
    declared = t.bytes > INT64_MAX - declared ? INT64_MAX : declared + t.bytes;
  }
  if (declared > context_.max_request_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("tensors: ", declared,
                                                     " declared bytes exceed limits.max_request_bytes (",
                                                     context_.max_request_bytes, ")"));
  }
  if (declared > staging_->limit()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tensors: ", declared, " declared bytes can never fit in staging.memory_limit (",
                     staging_->limit(), ")"));
  }
  return declared;
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
  ASSIGN_OR_RETURN(const int64_t declared, CheckSaveSize(tensors));
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
  spdlog::debug("run '{}' step {}: staged trainer {} of {} from {}: {} tensor(s), {} bytes in {:.3f} s ({})",
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

grpc::ServerUnaryReactor* CkptdService::Wait(grpc::CallbackServerContext* ctx, const v1::StepRef* request,
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

absl::Status CkptdService::DoRestore(const v1::RestoreRequest& request, const std::string& peer,
                                     absl::Time deadline, RestoreStream* writer) {
  RETURN_IF_ERROR(ValidateRunName(request.run()));
  ASSIGN_OR_RETURN(Placement placement, ValidatePlacement(request.mesh(), request.device_ids()));
  RETURN_IF_ERROR(CheckTensorCount(request.tensors_size()));
  ASSIGN_OR_RETURN(RestoreWants wants, RestoreWantsFromProto(request));
  if (wants.any_on_device) RETURN_IF_ERROR(device_->Available());
  const std::optional<int64_t> step =
      request.latest() ? std::nullopt : std::optional<int64_t>(request.step());
  std::string note;
  ASSIGN_OR_RETURN(std::vector<RestoreSource> candidates,
                   RestoreSources(request.run(), step, request.latest() && request.fallback(), &note));
  // With fallback, a step whose requested bytes fail verification while they are read
  // is skipped for the next older one; nothing is sent before a step reads cleanly. A
  // step the local copies cannot give whole (lost or unreachable files) is read from
  // the drain when it holds the step.
  for (size_t i = 0; i < candidates.size(); ++i) {
    const RestoreSource& source = candidates[i];
    absl::Status s = RestoreStep(request, wants, placement, source, note, peer, deadline,
                                 /*last_candidate=*/i + 1 == candidates.size(), writer);
    if (s.ok()) return s;
    const bool drained_next =
        i + 1 < candidates.size() && candidates[i + 1].drained && candidates[i + 1].step == source.step;
    const bool unreadable_here =
        absl::IsDataLoss(s) || absl::IsUnavailable(s) || absl::IsFailedPrecondition(s) || absl::IsNotFound(s);
    if (drained_next && unreadable_here) {
      absl::StrAppend(&note, note.empty() ? "" : "; ", "step ", source.step, " from the drain (", s.message(),
                      ")");
      continue;
    }
    if (candidates.size() == 1 || i + 1 == candidates.size() || !absl::IsDataLoss(s)) {
      return note.empty() ? s : Annotate(s, note);
    }
    absl::StrAppend(&note, note.empty() ? "" : "; ", "skipped step ", source.step,
                    source.drained ? " (drained)" : "", ": ", s.message());
  }
  return absl::DataLossError(
      absl::StrCat("run '", request.run(), "': no committed step verifies (", note, ")"));
}

absl::StatusOr<std::vector<CkptdService::RestoreSource>> CkptdService::RestoreSources(
    const std::string& run, std::optional<int64_t> step, bool fallback, std::string* note) const {
  absl::StatusOr<std::vector<int64_t>> local = store_->RestoreCandidates(run, step, fallback);
  const CheckpointStore* drain = context_.drain_store;
  // NOT_FOUND here may still be a drained step, or a lost one (below).
  if (!local.ok() && !absl::IsNotFound(local.status())) return local.status();
  std::vector<RestoreSource> sources;
  for (int64_t s : local.value_or(std::vector<int64_t>())) sources.push_back({.step = s, .store = store_});
  if (drain != nullptr) {
    absl::StatusOr<std::vector<int64_t>> drained = drain->RestoreCandidates(run, step, fallback);
    if (!drained.ok() && !absl::IsNotFound(drained.status())) {
      spdlog::warn("drain {}: {}", drain->root(), std::string(drained.status().message()));
    }
    for (int64_t s : drained.value_or(std::vector<int64_t>())) {
      sources.push_back({.step = s, .store = drain, .drained = true});
    }
  }
  // Newest first; a step's local copy before its drained one.
  std::stable_sort(sources.begin(), sources.end(),
                   [](const RestoreSource& a, const RestoreSource& b) { return a.step > b.step; });
  // A lost step is DATA_LOSS, never NOT_FOUND, and never quietly an older step.
  const auto lost = store_->LostSteps(run).value_or(std::vector<std::pair<int64_t, std::string>>());
  for (auto it = lost.rbegin(); it != lost.rend(); ++it) {
    const auto& [lost_step, why] = *it;
    const bool asked = step.has_value() && *step == lost_step;
    const bool newest = !step.has_value() && (sources.empty() || lost_step > sources.front().step);
    if (!(asked && sources.empty()) && !newest) continue;
    const std::string what = absl::StrCat("run '", run, "' step ", lost_step, " was lost: ", why);
    if (newest && fallback && !sources.empty()) {
      absl::StrAppend(note, note->empty() ? "" : "; ", "skipped step ", lost_step, ": lost (", why, ")");
      continue;
    }
    return absl::DataLossError(
        sources.empty()
            ? what
            : absl::StrCat(what, "; step ", sources.front().step,
                           " is the newest that survives: restore it by number or with fallback"));
  }
  if (sources.empty()) {
    return absl::NotFoundError(step.has_value()
                                   ? absl::StrCat("run '", run, "' has no committed step ", *step)
                                   : absl::StrCat("run '", run, "' has no committed checkpoint"));
  }
  if (!fallback) {
    // The newest step only, from wherever holds it.
    const int64_t newest = sources.front().step;
    std::erase_if(sources, [newest](const RestoreSource& s) { return s.step != newest; });
  }
  return sources;
}

namespace {

// Writes one RestoreResponse that is not a chunk: a header, a trailer, a ready.
absl::Status Send(const v1::RestoreResponse& message, RestoreStream* writer) {
  ASSIGN_OR_RETURN(grpc::ByteBuffer bytes, EncodeRestoreResponse(message));
  return writer->Write(bytes) ? absl::OkStatus() : absl::CancelledError("client went away");
}

// Reads the whole plan into `destinations` (a shared-memory reply) and, as tensors
// are read and verified, names them in a RestoreReady for about every kReadyBytes, so
// that the trainer copies them out of the segment while the rest are read: its copy
// no longer follows the daemon's reads (measured in the README's benchmark section).
// One message per tensor would cost a restore of 100,000 small tensors as many
// writes; tensors not yet named when the reads end are implied by the trailer.
absl::Status ReadAndAnnounce(BundleReader& reader, const RestorePlan& plan,
                             const std::vector<char*>& destinations, RestoreStream* writer) {
  constexpr int64_t kReadyBytes = int64_t{16} << 20;
  // Guards the three below, and the writer: one thread writes at a time.
  absl::Mutex mu;
  v1::RestoreResponse ready;
  int64_t ready_bytes = 0;
  absl::Status sent;
  auto announce = [&](size_t item) {
    absl::MutexLock lock(&mu);
    ready.mutable_ready()->add_tensor_indices(static_cast<int32_t>(item));
    ready_bytes += plan.items[item].bytes;
    if (ready_bytes < kReadyBytes || !sent.ok()) return;
    sent = Send(ready, writer);  // a small message: the transport takes it at once
    ready.Clear();
    ready_bytes = 0;
  };
  RETURN_IF_ERROR(
      ReadPlanItems(reader, plan, destinations, kRestoreReadThreads, 0, plan.items.size(), announce));
  absl::MutexLock lock(&mu);
  return sent;
}

}  // namespace

absl::Status CkptdService::RestoreStep(const v1::RestoreRequest& request, const RestoreWants& wants,
                                       const Placement& placement, const RestoreSource& source,
                                       std::string note, const std::string& peer, absl::Time deadline,
                                       bool last_candidate, RestoreStream* writer) {
  const int64_t step = source.step;
  const absl::Time started = absl::Now();
  ReadStack stack;
  FileSystem* fs = nullptr;
  if (source.drained) {
    // A drained step is whole in one directory, which the cache does not follow.
    fs = source.store->fs();
    if (context_.read_cache != nullptr) {
      fs = &stack.cached.emplace(fs, context_.read_cache, CachingFileSystem::Reads::kCounted, &stack.counts);
    }
  } else {
    // Blocks are kept for every reader where other hosts' daemons read through this
    // one; otherwise only where another restore here declared it wants them too.
    fs = StepFileSystem(request.run(), step, deadline, /*keep_all=*/ReadsThroughPeers(), &stack);
  }
  const bool through_peers = stack.peers.has_value();
  ASSIGN_OR_RETURN(std::unique_ptr<BundleReader> reader,
                   BundleReader::Open(fs, CheckpointStore::Prefix(source.store->StepDir(request.run(), step)),
                                      context_.max_index_bytes));
  // Retention leaves a step alone while it is restored.
  const StepRegistry::RestorePin pin(registry_, {request.run(), step});
  absl::StatusOr<RestorePlan> planned = PlanRestore(*reader, wants.tensors, placement);
  // A data file missing here is DATA_LOSS on a shared root, but on local disks it
  // is another host's shard: say so, and do not let fallback skip good steps for it.
  if (absl::IsDataLoss(planned.status()) && context_.local_storage && !through_peers && !source.drained) {
    RETURN_IF_ERROR(CheckShardsHere(*reader, store_->StepDir(request.run(), step)));
  }
  ASSIGN_OR_RETURN(RestorePlan plan, std::move(planned));
  if (context_.read_cache != nullptr)
    stack.interest = context_.read_cache->Declare(StoredRanges(*reader, plan));
  if (!note.empty() || source.drained) {
    absl::StrAppend(&note, note.empty() ? "" : "; ", "restored step ", step,
                    source.drained ? absl::StrCat(" from the drained copy in ", source.store->root()) : "");
    spdlog::warn("Restore of run '{}': {}", request.run(), note);
  }
  v1::RestoreResponse header_message;
  *header_message.mutable_header() = RestoreHeaderFor(plan, wants, step, note);
  if (request.trainer_state()) {
    ASSIGN_OR_RETURN(auto state, ReadTrainerState(*reader, request.trainer_id()));
    header_message.mutable_header()->mutable_trainer_state()->insert(state.begin(), state.end());
  }
  if (request.describe_only()) {
    return Send(header_message, writer);
  }
  ASSIGN_OR_RETURN(std::shared_ptr<SharedSegment> mapped, MapReplySegment(peer, request, plan));
  // With nothing to fall back to and no device memory, a reply goes out while it is
  // read: streamed to host memory, or named tensor by tensor in shared memory.
  // Otherwise everything is read (and verified) before anything is sent, so that a
  // corrupt shard fails the whole call and fallback can still try an older step.
  const bool send_header_first = last_candidate && !request.fallback() &&
                                 absl::c_none_of(wants.devices, [](const auto& d) { return d.has_value(); });
  const bool stream_while_reading =
      send_header_first && mapped == nullptr &&
      absl::c_none_of(wants.host_memory, [](const auto& h) { return h.has_value(); });
  const bool announce_while_reading = send_header_first && mapped != nullptr;
  ASSIGN_OR_RETURN(std::vector<std::shared_ptr<SharedSegment>> host_memory, MapHostMemory(peer, plan, wants));
  ASSIGN_OR_RETURN(RestoreOutputs out, PrepareOutputs(plan, wants, mapped, std::move(host_memory), deadline,
                                                      stream_while_reading));
  v1::RestoreHeader& header = *header_message.mutable_header();
  int64_t delivered = 0;
  for (const RestoreItem& item : plan.items) delivered += item.bytes;
  header.set_bytes_delivered(delivered);
  if (stream_while_reading || announce_while_reading) {
    RETURN_IF_ERROR(Send(header_message, writer));
    if (stream_while_reading) {
      RETURN_IF_ERROR(ReadAndStream(*reader, plan, deadline, out, writer));
    } else {
      RETURN_IF_ERROR(ReadAndAnnounce(*reader, plan, out.destinations, writer));
    }
    v1::RestoreResponse trailer;
    trailer.mutable_trailer()->set_storage_bytes_read(
        static_cast<int64_t>(stack.counts.storage_bytes.load()));
    trailer.mutable_trailer()->set_peer_bytes_received(static_cast<int64_t>(stack.counts.peer_bytes.load()));
    RETURN_IF_ERROR(Send(trailer, writer));
  } else {
    RETURN_IF_ERROR(ReadPlan(*reader, plan, out.destinations, kRestoreReadThreads));
    header.set_storage_bytes_read(static_cast<int64_t>(stack.counts.storage_bytes.load()));
    header.set_peer_bytes_received(static_cast<int64_t>(stack.counts.peer_bytes.load()));
    for (size_t i = 0; i < plan.items.size(); ++i) {
      if (!wants.devices[i].has_value()) continue;
      if (absl::Status s = device_->CopyToDevice(out.device_buffers[i], *wants.devices[i]); !s.ok()) {
        return Annotate(s, absl::StrCat("tensor '", plan.items[i].info.name, "'"));
      }
      out.device_buffers[i] = StagedBuffer();
    }
    RETURN_IF_ERROR(Send(header_message, writer));
    RETURN_IF_ERROR(SendChunks(out, 0, out.streamed.size(), writer));
  }
  restore_peer_bytes_ += stack.counts.peer_bytes.load();
  restore_bytes_delivered_ += static_cast<uint64_t>(delivered);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - started);
  spdlog::info(
      "run '{}' step {} restored for {} (trainer {}): {} tensor(s), {} bytes delivered in {:.3f} s "
      "({:.0f} MB/s); {} bytes read from storage, {} from peers{}",
      request.run(), step, peers_->Describe(peer), request.trainer_id(), plan.items.size(), delivered,
      seconds, seconds > 0 ? static_cast<double>(delivered) / seconds / 1e6 : 0.0,
      stack.counts.storage_bytes.load(), stack.counts.peer_bytes.load(),
      mapped != nullptr ? " (shared memory)" : "");
  if (context_.metrics != nullptr) {
    const Metrics::Labels run = {{"run", request.run()}};
    context_.metrics->Count("ckptd_restores_total", run);
    context_.metrics->Count("ckptd_restore_bytes_delivered_total", run, static_cast<double>(delivered));
    context_.metrics->Count("ckptd_restore_storage_bytes_read_total", run,
                            static_cast<double>(stack.counts.storage_bytes.load()));
    context_.metrics->Observe("ckptd_restore_seconds", run, seconds);
  }
  if (spdlog::should_log(spdlog::level::debug)) {
    for (const RestoreItem& item : plan.items) {
      std::vector<std::string> boxes;
      for (const Box& box : item.boxes) boxes.push_back(box.ToString());
      spdlog::debug("run '{}' step {}: restored '{}' {} as {} ({} bytes)", request.run(), step,
                    item.info.name, absl::StrJoin(boxes, " "), DataTypeName(item.dtype), item.bytes);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SharedSegment>> CkptdService::MapReplySegment(
    const std::string& peer, const v1::RestoreRequest& request, const RestorePlan& plan) {
  if (!request.has_shared_memory()) return nullptr;
  ASSIGN_OR_RETURN(pid_t pid, peers_->LocalPid(peer));
  const v1::SharedMemory& shm = request.shared_memory();
  if (shm.size() < plan.shared_memory_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("shared_memory.size: ", shm.size(),
                                                   " bytes, but the reply needs ", plan.shared_memory_bytes,
                                                   " (see describe_only)"));
  }
  return segments_.Open(pid, shm.fd(), shm.offset(), plan.shared_memory_bytes, SharedSegment::Access::kWrite);
}

absl::StatusOr<std::vector<std::shared_ptr<SharedSegment>>> CkptdService::MapHostMemory(
    const std::string& peer, const RestorePlan& plan, const RestoreWants& wants) {
  std::vector<std::shared_ptr<SharedSegment>> host_memory(plan.items.size());
  std::optional<pid_t> pid;
  for (size_t i = 0; i < plan.items.size(); ++i) {
    if (!wants.host_memory[i].has_value()) continue;
    const v1::SharedMemory& host = *wants.host_memory[i];
    const std::string field = absl::StrCat("tensors[", i, "].host_memory");
    if (host.size() != plan.items[i].bytes) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".size: ", host.size(), " bytes, but tensor '",
                                                     plan.items[i].info.name, "' restores as ",
                                                     plan.items[i].bytes));
    }
    if (!pid.has_value()) {
      ASSIGN_OR_RETURN(pid, peers_->LocalPid(peer));
    }
    absl::StatusOr<std::shared_ptr<SharedSegment>> mapped =
        segments_.Open(*pid, host.fd(), host.offset(), host.size(), SharedSegment::Access::kWrite);
    if (!mapped.ok()) return Annotate(mapped.status(), field);
    host_memory[i] = *std::move(mapped);
  }
  return host_memory;
}

absl::StatusOr<CkptdService::RestoreOutputs> CkptdService::PrepareOutputs(
    const RestorePlan& plan, const RestoreWants& wants, const std::shared_ptr<SharedSegment>& mapped,
    std::vector<std::shared_ptr<SharedSegment>> host_memory, absl::Time deadline, bool defer_streamed) {
  RestoreOutputs out;
  out.host_memory = std::move(host_memory);
  out.streamed.resize(plan.items.size());
  out.kept.resize(plan.items.size());
  out.device_buffers.resize(plan.items.size());
  out.destinations.reserve(plan.items.size());
  for (size_t i = 0; i < plan.items.size(); ++i) {
    if (wants.devices[i].has_value()) {
      ASSIGN_OR_RETURN(out.device_buffers[i], staging_->Allocate(plan.items[i].bytes, deadline));
      out.destinations.push_back(out.device_buffers[i].data());
    } else if (out.host_memory[i] != nullptr) {
      out.destinations.push_back(out.host_memory[i]->data());
    } else if (mapped != nullptr) {
      out.destinations.push_back(mapped->data() + plan.items[i].shared_memory_offset);
    } else {
      out.destinations.push_back(nullptr);  // streamed: AllocateStreamed
    }
  }
  if (mapped == nullptr && !defer_streamed) {
    // The whole reply is held at once: say so now rather than wait for room that can
    // never come.
    int64_t streamed = 0;
    for (size_t i = 0; i < plan.items.size(); ++i) {
      if (out.destinations[i] == nullptr) streamed += plan.items[i].bytes;
    }
    if (streamed > staging_->limit()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("this streamed restore may still fall back to an older step or the drained copy, so "
                       "it holds its whole reply (",
                       streamed, " bytes) in staging memory, more than staging.memory_limit (",
                       staging_->limit(), " bytes): restore over shared memory, or fewer tensors per call"));
    }
    RETURN_IF_ERROR(AllocateStreamed(plan, 0, plan.items.size(), deadline, out));
  }
  return out;
}

absl::Status CkptdService::AllocateStreamed(const RestorePlan& plan, size_t begin, size_t end,
                                            absl::Time deadline, RestoreOutputs& out) {
  static char nothing;  // an empty box: zero bytes read to a valid address
  for (size_t i = begin; i < end; ++i) {
    if (out.destinations[i] != nullptr) continue;  // bound for a device or host memory
    if (out.kept[i].data() != nullptr) continue;   // sent as it is kept
    if (plan.items[i].bytes == 0) {
      out.destinations[i] = &nothing;
      continue;
    }
    ASSIGN_OR_RETURN(out.streamed[i], staging_->Allocate(plan.items[i].bytes, deadline));
    out.destinations[i] = out.streamed[i].data();
  }
  return absl::OkStatus();
}

v1::RestoreHeader CkptdService::RestoreHeaderFor(const RestorePlan& plan, const RestoreWants& wants,
                                                 int64_t step, const std::string& note) {
  v1::RestoreHeader header;
  header.set_step(step);
  header.set_note(note);
  for (size_t i = 0; i < plan.items.size(); ++i) {
    const RestoreItem& item = plan.items[i];
    v1::TensorDescriptor* d = header.add_tensors();
    d->set_name(item.info.name);
    d->set_dtype(item.dtype);
    d->mutable_shape()->Add(item.info.shape.begin(), item.info.shape.end());
    for (const Box& box : item.boxes) {
      v1::Box* b = wants.tensors[i].layout.has_value() ? d->add_device_boxes() : d->mutable_box();
      b->mutable_start()->Add(box.start.begin(), box.start.end());
      b->mutable_length()->Add(box.length.begin(), box.length.end());
    }
    header.add_shared_memory_offsets(item.shared_memory_offset);
  }
  header.set_shared_memory_bytes(plan.shared_memory_bytes);
  return header;
}

absl::Status CkptdService::ReadAndStream(BundleReader& reader, const RestorePlan& plan, absl::Time deadline,
                                         RestoreOutputs& out, RestoreStream* writer) {
  constexpr int64_t kGroupBytes = int64_t{64} << 20;
  std::vector<std::pair<size_t, size_t>> groups;  // item ranges
  for (size_t begin = 0, end = 0; begin < plan.items.size(); begin = end) {
    int64_t bytes = 0;
    while (end < plan.items.size() && bytes < kGroupBytes) bytes += plan.items[end++].bytes;
    groups.emplace_back(begin, end);
  }
  // Whole entries kept in memory in the dtype asked for go out from there as they are:
  // the tier checked them when it kept them, and a copy into staging would only add a
  // pass over the bytes.
  for (size_t i = 0; i < plan.items.size(); ++i) {
    const RestoreItem& item = plan.items[i];
    if (item.bytes > 0 && item.boxes.size() == 1 && item.info.pieces.size() == 1 &&
        item.info.pieces[0].box == item.boxes[0] && item.dtype == item.info.dtype && item.dtype != kString &&
        item.info.pieces[0].entry.size() == item.bytes) {
      if (const char* held = reader.KeptEntry(item.info.pieces[0].entry); held != nullptr) {
        out.kept[i] = absl::MakeConstSpan(held, static_cast<size_t>(item.bytes));
      }
    }
  }
  absl::Status read;  // of the group read last; written by `next` only while it runs
  auto read_group = [&](size_t g) {
    read = AllocateStreamed(plan, groups[g].first, groups[g].second, deadline, out);
    if (read.ok()) {
      read = ReadPlanItems(reader, plan, out.destinations, kRestoreReadThreads, groups[g].first,
                           groups[g].second);
    }
  };
  if (!groups.empty()) read_group(0);
  for (size_t g = 0; g < groups.size(); ++g) {
    RETURN_IF_ERROR(read);
    std::thread next;
    if (g + 1 < groups.size()) next = std::thread(read_group, g + 1);
    const absl::Status sent = SendChunks(out, groups[g].first, groups[g].second, writer);
    if (next.joinable()) next.join();
    RETURN_IF_ERROR(sent);
  }
  return absl::OkStatus();
}

absl::Status CkptdService::SendChunks(RestoreOutputs& out, size_t begin, size_t end, RestoreStream* writer) {
  for (size_t i = begin; i < end; ++i) {
    const bool from_kept = out.kept[i].data() != nullptr;
    const char* data = from_kept ? out.kept[i].data() : out.streamed[i].data();
    const size_t size = from_kept ? out.kept[i].size() : static_cast<size_t>(out.streamed[i].size());
    for (size_t off = 0; off < size; off += wire::kRestoreChunkBytes) {
      const absl::Span<const char> piece(data + off, std::min(size - off, wire::kRestoreChunkBytes));
      if (!writer->Write(EncodeRestoreChunk(static_cast<int32_t>(i), static_cast<int64_t>(off), piece))) {
        return absl::CancelledError("client went away");
      }
    }
    out.streamed[i] = StagedBuffer();  // memory back as soon as it is sent
  }
  return absl::OkStatus();
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
      int64_t bytes = 0;
      if (auto names = store_->fs()->ListDir(info->path()); names.ok()) {
        for (const std::string& name : *names) {
          if (auto size = store_->fs()->FileSize(JoinPath(info->path(), name)); size.ok()) bytes += *size;
        }
      }
      info->set_bytes(bytes);
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

bool CkptdService::ReadsThroughPeers() const {
  // Other hosts' data files are read through their daemons when they are known (a
  // TCP listener with mutual TLS): on local disks, where they are not here, and with
  // read_once, where one daemon reads each file for all.
  return (context_.local_storage || context_.read_once) && context_.peer_directory != nullptr &&
         context_.peer_directory->ready() && context_.num_ranks >= 2;
}

FileSystem* CkptdService::StepFileSystem(const std::string& run, int64_t step, absl::Time deadline,
                                         bool keep_all, ReadStack* stack) const {
  FileSystem* fs = store_->fs();
  if (context_.storage != nullptr && context_.read_cache != nullptr) {
    fs = &stack->cached.emplace(context_.storage, context_.read_cache, CachingFileSystem::Reads::kCached,
                                &stack->counts, keep_all ? nullptr : &stack->interest);
    if (memory_tier_ != nullptr) fs = &stack->memory.emplace(fs, memory_tier_);
  }
  if (!ReadsThroughPeers()) {
    stack->top = fs;
    return fs;
  }
  stack->top = &stack->peers.emplace(fs, context_.peer_directory, run, step,
                                     std::min(deadline, absl::Now() + context_.peer_timeout),
                                     context_.read_once, !context_.local_storage, &stack->counts);
  return stack->top;
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
  if (!data_file && request.file() != "ckpt.index" && request.file() != kCheckpointMetaFile) {
    return absl::InvalidArgumentError(
        absl::StrCat("file: '", request.file(), "' is not ckpt.index, ckptd.json or a data file of a step"));
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
  ReadStack stack;
  // Another host's daemon asks, for its trainers: blocks are kept for the others.
  FileSystem* fs = StepFileSystem(request.run(), request.step(), deadline, /*keep_all=*/true, &stack);
  ASSIGN_OR_RETURN(
      std::unique_ptr<RandomAccessFile> file,
      fs->NewRandomAccessFile(JoinPath(store_->StepDir(request.run(), request.step()), request.file())));
  return Annotate(SendFileRange(*file, request.offset(), request.length(), writer), request.file());
}

absl::Status CkptdService::CheckShardsHere(const BundleReader& reader, const std::string& step_dir) const {
  std::vector<std::string> elsewhere;
  absl::StatusOr<std::string> text =
      store_->fs()->ReadFileToString(JoinPath(step_dir, kCheckpointMetaFile), context_.max_index_bytes);
  absl::StatusOr<CheckpointMeta> meta =
      text.ok() ? CheckpointMeta::FromJson(*text) : absl::StatusOr<CheckpointMeta>(text.status());
  for (int shard = 0; shard < reader.header().num_shards(); ++shard) {
    if (store_->fs()->Exists(reader.DataFile(shard))) continue;
    std::string host;
    if (meta.ok()) {
      for (const CheckpointMeta::Host& h : meta->hosts) {
        if (h.rank == shard && !h.host.empty()) host = absl::StrCat(" (", h.host, ")");
      }
    }
    elsewhere.push_back(absl::StrCat(shard, host));
  }
  if (elsewhere.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("this restore needs the shard(s) of rank(s) ",
                                                    JoinBounded(elsewhere),
                                                    ", which live on other hosts' disks "
                                                    "(storage: local); this daemon cannot read other hosts' "
                                                    "shards yet: restore those tensors from the daemons "
                                                    "that hold them, or use storage: shared"));
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
  const v1::StatusResponse now = LocalStatus();
  return context_.metrics->Render({
      {"ckptd_staged_bytes", "Bytes staged in daemon memory now (pending and in-flight steps).",
       static_cast<double>(now.bytes_staged())},
      {"ckptd_in_flight_bytes", "Staged bytes of steps being committed now.",
       static_cast<double>(now.bytes_in_flight())},
      {"ckptd_pooled_bytes", "Freed staging memory kept for reuse.", static_cast<double>(now.pooled_bytes())},
      {"ckptd_peak_staged_bytes", "Most bytes staged at once since start.",
       static_cast<double>(now.peak_bytes_staged())},
      {"ckptd_staging_memory_limit_bytes", "The staging budget.",
       static_cast<double>(now.staging_memory_limit())},
      {"ckptd_pending_steps", "Steps this daemon holds staged bytes of.",
       static_cast<double>(now.pending_steps_size())},
      {"ckptd_read_cache_bytes", "Bytes the read cache holds now.",
       static_cast<double>(now.read_cache_bytes())},
      {"ckptd_direct_io_in_place_bytes",
       "Bytes read into or written from trainers' huge-page segments with O_DIRECT in place (no copy "
       "through the daemon's own buffers), since start.",
       static_cast<double>(direct_io_memory::InPlaceBytes())},
  });
}

v1::StatusResponse CkptdService::LocalStatus() const {
  v1::StatusResponse status;
  v1::StatusResponse* response = &status;
  response->set_rank(context_.rank);
  response->set_peak_bytes_staged(staging_->peak_bytes_staged());
  response->set_staging_memory_limit(staging_->limit());
  response->set_tcp_address(context_.tcp_address);
  response->set_metrics_address(metrics_address_);
  response->set_num_ranks(context_.num_ranks);
  response->set_version(context_.version);
  response->set_root(store_->root());
  response->set_pid(::getpid());
  for (const StepKey& key : registry_->PendingSteps()) {
    v1::StepRef* ref = response->add_pending_steps();
    ref->set_run(key.run);
    ref->set_step(key.step);
  }
  for (const StepRegistry::GatheringStep& g : registry_->Gathering()) {
    v1::GatheringStep* out = response->add_gathering();
    out->set_run(g.key.run);
    out->set_step(g.key.step);
    out->set_trainer_count(g.trainer_count);
    out->set_trainers_staged(g.trainers_staged);
    out->mutable_missing_trainers()->Add(g.missing.begin(), g.missing.end());
    out->set_deadline_unix_seconds(absl::ToDoubleSeconds(g.deadline - absl::UnixEpoch()));
  }
  for (const auto& [run, step] : registry_->LastCommitted()) {
    v1::RunStatus* rs = response->add_runs();
    rs->set_run(run);
    rs->set_last_committed_step(step);
  }
  response->set_bytes_staged(staging_->bytes_staged());
  response->set_bytes_written(registry_->bytes_written());
  response->set_bytes_in_flight(registry_->bytes_in_flight());
  response->set_pooled_bytes(staging_->pooled_bytes());
  const DeviceStager::Totals device = device_->CopyTotals();
  response->set_device_to_host_bytes(device.to_host_bytes);
  response->set_device_to_host_seconds(device.to_host_seconds);
  response->set_host_to_device_bytes(device.to_device_bytes);
  response->set_host_to_device_seconds(device.to_device_seconds);
  response->set_device_memory(device_->Describe());
  if (context_.read_cache != nullptr) {
    response->set_restore_storage_bytes_read(static_cast<int64_t>(context_.read_cache->storage_bytes_read()));
    response->set_read_cache_hit_bytes(static_cast<int64_t>(context_.read_cache->hit_bytes()));
    response->set_read_cache_bytes(static_cast<int64_t>(context_.read_cache->held_bytes()));
  }
  response->set_restore_bytes_delivered(static_cast<int64_t>(restore_bytes_delivered_.load()));
  response->set_restore_peer_bytes_received(static_cast<int64_t>(restore_peer_bytes_.load()));
  if (memory_tier_ != nullptr) {
    response->set_memory_steps_limit(memory_tier_->max_steps());
    for (const MemoryTier::Held& held : memory_tier_->Steps()) {
      v1::KeptStep* kept = response->add_memory_steps();
      kept->set_run(held.key.run);
      kept->set_step(held.key.step);
      kept->set_bytes(held.bytes);
    }
  }
  const std::map<std::string, StepRegistry::CommitTiming> timings = registry_->LastCommitTimings();
  for (v1::RunStatus& rs : *response->mutable_runs()) {
    auto it = timings.find(rs.run());
    if (it == timings.end()) continue;
    rs.set_last_commit_unix_seconds(absl::ToDoubleSeconds(it->second.when - absl::UnixEpoch()));
    rs.set_last_commit_seconds(absl::ToDoubleSeconds(it->second.took));
  }
  return status;
}

}  // namespace ckptd
