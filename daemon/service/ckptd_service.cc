#include "daemon/service/ckptd_service.h"

#include <spdlog/spdlog.h>

#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/service/validation.h"

namespace ckptd {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

grpc::Status CkptdService::Save(grpc::ServerContext* ctx, grpc::ServerReader<v1::SaveRequest>* reader,
                                v1::SaveResponse* response) {
  absl::Status s = DoSave(reader, response);
  if (!s.ok()) spdlog::warn("Save from {}: {}", ctx->peer(), std::string(s.message()));
  return ToGrpcStatus(s);
}

absl::Status CkptdService::DoSave(grpc::ServerReader<v1::SaveRequest>* reader, v1::SaveResponse* response) {
  if (!accepting_) return absl::UnavailableError("ckptd is shutting down");
  const absl::Time started = absl::Now();
  v1::SaveRequest message;
  if (!reader->Read(&message) || !message.has_header()) {
    return absl::InvalidArgumentError("header: the first message of a Save stream must be a header");
  }
  const v1::SaveHeader header = message.header();
  std::vector<CheckedTensor> tensors;
  RETURN_IF_ERROR(ValidateSaveHeader(header, &tensors));
  if (store_->IsCommitted(header.run(), header.step())) {
    return absl::AlreadyExistsError(absl::StrCat("run '", header.run(), "' step ", header.step(), " is already committed"));
  }

  TrainerPayload payload;
  payload.trainer_id = header.trainer_id();
  std::vector<int64_t> sizes;
  int64_t expected = 0;
  for (CheckedTensor& t : tensors) {
    if (t.bytes > INT64_MAX - expected) return absl::InvalidArgumentError("tensors: total bytes overflow");
    expected += t.bytes;
    sizes.push_back(t.bytes);
    payload.tensors.push_back({std::move(t.name), t.dtype, std::move(t.shape), std::move(t.box), StagedBuffer()});
  }
  // Bytes arrive as one stream: fill tensor buffers in descriptor order. A buffer is
  // allocated when its first byte arrives, so a header alone reserves no memory.
  size_t tensor = 0;
  int64_t filled = 0;  // bytes of payload.tensors[tensor] filled so far
  int64_t received = 0;
  while (reader->Read(&message)) {
    if (!message.has_data() && message.has_header()) {
      return absl::InvalidArgumentError("header: a Save stream carries exactly one header");
    }
    const std::string& data = message.data();
    if (data.size() > kMaxChunkBytes) {
      return absl::InvalidArgumentError(absl::StrCat("data: chunk of ", data.size(), " bytes exceeds ", kMaxChunkBytes));
    }
    if (received + static_cast<int64_t>(data.size()) > expected) {
      return absl::InvalidArgumentError(absl::StrCat("data: more bytes than the descriptors need (", expected,
                                                     " = box elements x dtype size, summed)"));
    }
    received += static_cast<int64_t>(data.size());
    size_t used = 0;
    while (used < data.size()) {
      while (tensor < payload.tensors.size() && filled == sizes[tensor]) {
        ++tensor;
        filled = 0;
      }
      StagedBuffer& buf = payload.tensors[tensor].bytes;
      if (!buf.allocated()) {
        ASSIGN_OR_RETURN(buf, staging_->Allocate(sizes[tensor]));
      }
      const size_t n = std::min<size_t>(data.size() - used, static_cast<size_t>(buf.size() - filled));
      std::memcpy(buf.data() + filled, data.data() + used, n);
      filled += static_cast<int64_t>(n);
      used += n;
    }
  }
  if (received != expected) {
    return absl::InvalidArgumentError(absl::StrCat("data: received ", received, " bytes but the descriptors need ",
                                                   expected, " (box elements x dtype size, summed)"));
  }
  for (size_t i = 0; i < payload.tensors.size(); ++i) {  // empty tensors received no chunk
    if (!payload.tensors[i].bytes.allocated()) {
      ASSIGN_OR_RETURN(payload.tensors[i].bytes, staging_->Allocate(sizes[i]));
    }
  }
  RETURN_IF_ERROR(registry_->Stage({header.run(), header.step()}, header.trainer_count(), std::move(payload)));
  response->set_bytes_staged(expected);
  response->set_staging_seconds(absl::ToDoubleSeconds(absl::Now() - started));
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* CkptdService::Wait(grpc::CallbackServerContext* ctx, const v1::StepRef* request,
                                             v1::WaitResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (absl::Status s = ValidateRunName(request->run()); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  const StepKey key{request->run(), request->step()};
  response->set_path(store_->StepDir(key.run, key.step));
  // Committed before this daemon started: the directory is the proof.
  if (!registry_->Outcome(key).has_value() && store_->IsCommitted(key.run, key.step)) {
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  registry_->AddStepWaiter(key, Waiter{[ctx] { return ctx->IsCancelled(); },
                                       [reactor](const absl::Status& s) { reactor->Finish(ToGrpcStatus(s)); }});
  return reactor;
}

grpc::ServerUnaryReactor* CkptdService::Barrier(grpc::CallbackServerContext* ctx, const v1::BarrierRequest* request,
                                                v1::BarrierResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s = ValidateRunName(request->run());
  if (s.ok() && (request->trainer_count() < 1 || request->trainer_id() < 0 ||
                 request->trainer_id() >= request->trainer_count())) {
    s = absl::InvalidArgumentError("trainer_id: must lie in [0, trainer_count) with trainer_count >= 1");
  }
  if (!s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  registry_->AddBarrierWaiter(request->run(), request->barrier_id(), request->trainer_count(),
                              Waiter{[ctx] { return ctx->IsCancelled(); },
                                     [reactor](const absl::Status& st) { reactor->Finish(ToGrpcStatus(st)); }});
  return reactor;
}

grpc::Status CkptdService::Restore(grpc::ServerContext* ctx, const v1::RestoreRequest* request,
                                   grpc::ServerWriter<v1::RestoreResponse>* writer) {
  absl::Status s = DoRestore(*request, writer);
  if (!s.ok()) spdlog::warn("Restore from {}: {}", ctx->peer(), std::string(s.message()));
  return ToGrpcStatus(s);
}

absl::Status CkptdService::DoRestore(const v1::RestoreRequest& request,
                                     grpc::ServerWriter<v1::RestoreResponse>* writer) {
  RETURN_IF_ERROR(ValidateRunName(request.run()));
  int64_t step = request.step();
  if (request.latest()) {
    ASSIGN_OR_RETURN(step, store_->LatestStep(request.run()));
  } else if (!store_->IsCommitted(request.run(), step)) {
    return absl::NotFoundError(absl::StrCat("run '", request.run(), "' has no committed step ", step));
  }
  const std::string prefix = CheckpointStore::Prefix(store_->StepDir(request.run(), step));
  ASSIGN_OR_RETURN(std::unique_ptr<BundleReader> reader,
                   BundleReader::Open(store_->fs(), prefix, context_.max_index_bytes));

  std::vector<TensorInfo> infos;
  std::vector<Box> boxes;
  v1::RestoreResponse header_message;
  v1::RestoreHeader* header = header_message.mutable_header();
  header->set_step(step);
  for (int i = 0; i < request.tensors_size(); ++i) {
    const v1::TensorRequest& want = request.tensors(i);
    const std::string field = absl::StrCat("tensors[", i, "]");
    ASSIGN_OR_RETURN(TensorInfo info, reader->Lookup(want.name()));
    if (want.dtype() != 0 && want.dtype() != info.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".dtype: tensor '", want.name(), "' is stored as ",
                                                     DataTypeName(info.dtype), ", not ", DataTypeName(want.dtype())));
    }
    if (want.shape_size() > 0 && Shape(want.shape().begin(), want.shape().end()) != info.shape) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".shape: tensor '", want.name(),
                                                     "' has a different stored shape"));
    }
    Box box = BoxFromProto(want.box(), info.shape, want.has_box());
    if (absl::Status s = CheckBoxInShape(box, info.shape); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".box ('", want.name(), "'): ", s.message()));
    }
    if (DataTypeSize(info.dtype) == 0) {
      return absl::UnimplementedError(absl::StrCat("tensor '", want.name(), "' has dtype ",
                                                   DataTypeName(info.dtype), ", which Restore cannot return"));
    }
    v1::TensorDescriptor* d = header->add_tensors();
    d->set_name(info.name);
    d->set_dtype(info.dtype);
    d->mutable_shape()->Add(info.shape.begin(), info.shape.end());
    d->mutable_box()->mutable_start()->Add(box.start.begin(), box.start.end());
    d->mutable_box()->mutable_length()->Add(box.length.begin(), box.length.end());
    infos.push_back(std::move(info));
    boxes.push_back(std::move(box));
  }
  // Read everything before sending anything, so a corrupt shard fails the whole call.
  std::vector<std::string> buffers(infos.size());
  for (size_t i = 0; i < infos.size(); ++i) {
    buffers[i].resize(static_cast<size_t>(boxes[i].NumElements()) * DataTypeSize(infos[i].dtype));
    RETURN_IF_ERROR(reader->ReadBox(infos[i], boxes[i], buffers[i].data()));
  }
  if (!writer->Write(header_message)) return absl::CancelledError("client went away");
  for (size_t i = 0; i < buffers.size(); ++i) {
    for (size_t off = 0; off < buffers[i].size(); off += kMaxChunkBytes) {
      v1::RestoreResponse chunk_message;
      v1::RestoreChunk* chunk = chunk_message.mutable_chunk();
      chunk->set_tensor_index(static_cast<int>(i));
      chunk->set_offset(static_cast<int64_t>(off));
      chunk->set_data(buffers[i].substr(off, kMaxChunkBytes));
      if (!writer->Write(chunk_message)) return absl::CancelledError("client went away");
    }
    std::string().swap(buffers[i]);
  }
  return absl::OkStatus();
}

grpc::Status CkptdService::ListCheckpoints(grpc::ServerContext* ctx, const v1::ListCheckpointsRequest* request,
                                           v1::ListCheckpointsResponse* response) {
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

grpc::Status CkptdService::Status(grpc::ServerContext* ctx, const v1::StatusRequest* request,
                                  v1::StatusResponse* response) {
  response->set_rank(context_.rank);
  response->set_num_ranks(context_.num_ranks);
  response->set_version(context_.version);
  response->set_root(store_->root());
  response->set_pid(::getpid());
  for (const StepKey& key : registry_->PendingSteps()) {
    v1::StepRef* ref = response->add_pending_steps();
    ref->set_run(key.run);
    ref->set_step(key.step);
  }
  for (const auto& [run, step] : registry_->LastCommitted()) {
    v1::RunStatus* rs = response->add_runs();
    rs->set_run(run);
    rs->set_last_committed_step(step);
  }
  response->set_bytes_staged(staging_->bytes_staged());
  response->set_bytes_written(registry_->bytes_written());
  return grpc::Status::OK;
}

}  // namespace ckptd
