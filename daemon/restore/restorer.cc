#include "daemon/restore/restorer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/base/dtype.h"
#include "daemon/base/logging.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/bundle/checkpoint_meta.h"

namespace ckptd {

absl::Status Restorer::Restore(const RestoreCall& call, const RestoreCaller& caller, absl::Time deadline,
                               RestoreSink* sink) {
  if (call.wants.any_on_device) RETURN_IF_ERROR(device_->Available());
  std::string note;
  ASSIGN_OR_RETURN(std::vector<RestoreSource> candidates,
                   RestoreSources(*tiers_->read_store(), tiers_->CopiesBeyondRoot(), call.run, call.step,
                                  !call.step.has_value() && call.fallback, &note));
  // With fallback, a step whose requested bytes fail verification while they are read
  // is skipped for the next older one; nothing is sent before a step reads cleanly. A
  // step the local copies cannot give whole (lost or unreachable files) is read from
  // the drain when it holds the step.
  for (size_t i = 0; i < candidates.size(); ++i) {
    const RestoreSource& source = candidates[i];
    absl::Status s = RestoreStep(call, source, note, caller, deadline,
                                 /*last_candidate=*/i + 1 == candidates.size(), sink);
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
  return absl::DataLossError(absl::StrCat("run '", call.run, "': no committed step verifies (", note, ")"));
}

absl::Status Restorer::RestoreStep(const RestoreCall& call, const RestoreSource& source, std::string note,
                                   const RestoreCaller& caller, absl::Time deadline, bool last_candidate,
                                   RestoreSink* sink) {
  const int64_t step = source.step;
  const absl::Time started = absl::Now();
  // Blocks are kept for every reader where other hosts' daemons read through this
  // one; otherwise only where another restore here declared it wants them too.
  const std::unique_ptr<StorageTiers::StepReads> reads =
      source.drained ? tiers_->ForDrainedStep()
                     : tiers_->ForStep(call.run, step, deadline, /*keep_all=*/tiers_->ReadsThroughPeers());
  ASSIGN_OR_RETURN(
      std::unique_ptr<BundleReader> reader,
      BundleReader::Open(reads->fs(), CheckpointStore::Prefix(source.store->StepDir(call.run, step)),
                         options_.max_index_bytes));
  // Retention leaves a step alone while it is restored.
  const StepRegistry::RestorePin pin(registry_, {call.run, step});
  absl::StatusOr<RestorePlan> planned = PlanRestore(*reader, call.wants.tensors, call.placement);
  // A data file missing here is DATA_LOSS on a shared root, but on local disks it
  // is another host's shard: say so, and do not let fallback skip good steps for it.
  if (absl::IsDataLoss(planned.status()) && reads->others_hold_missing_files()) {
    RETURN_IF_ERROR(CheckShardsHere(*reader, source.store->StepDir(call.run, step)));
  }
  ASSIGN_OR_RETURN(RestorePlan plan, std::move(planned));
  reads->Declare(tiers_->read_cache(), StoredRanges(*reader, plan));
  if (!note.empty() || source.drained) {
    absl::StrAppend(&note, note.empty() ? "" : "; ", "restored step ", step,
                    source.drained ? absl::StrCat(" from the drained copy in ", source.store->root()) : "");
    spdlog::warn("Restore of run '{}': {}", call.run, note);
  }
  v1::RestoreResponse header_message;
  *header_message.mutable_header() = RestoreHeaderFor(plan, call.wants, step, note);
  if (call.trainer_state) {
    ASSIGN_OR_RETURN(auto state, ReadTrainerState(*reader, call.trainer_id));
    header_message.mutable_header()->mutable_trainer_state()->insert(state.begin(), state.end());
  }
  if (call.describe_only) return sink->Send(header_message);
  // With nothing to fall back to and no device memory, a reply goes out while it is
  // read: streamed to host memory, or named tensor by tensor in shared memory.
  // Otherwise everything is read (and verified) before anything is sent, so that a
  // corrupt shard fails the whole call and fallback can still try an older step.
  const bool send_header_first =
      last_candidate && !call.fallback &&
      absl::c_none_of(call.wants.devices, [](const auto& d) { return d.has_value(); });
  // Where the trainer named its own memory and the kernel lets this daemon write it,
  // the reply is streamed into that memory as it is read, and its segment is never
  // touched.
  ASSIGN_OR_RETURN(std::unique_ptr<TrainerMemory> trainer_memory,
                   OpenTrainerMemory(call, caller, plan, send_header_first));
  std::shared_ptr<SharedSegment> mapped;
  if (trainer_memory == nullptr) {
    ASSIGN_OR_RETURN(mapped, MapReplySegment(call, caller, plan));
  }
  std::optional<TrainerMemorySink> into_trainer;
  if (trainer_memory != nullptr) {
    header_message.mutable_header()->set_process_memory(true);
    into_trainer.emplace(trainer_memory.get(), &call.wants.process_memory, sink);
    sink = &*into_trainer;
  }
  const bool stream_while_reading =
      send_header_first && mapped == nullptr &&
      absl::c_none_of(call.wants.host_memory, [](const auto& h) { return h.has_value(); });
  const bool announce_while_reading = send_header_first && mapped != nullptr;
  ASSIGN_OR_RETURN(std::vector<std::shared_ptr<SharedSegment>> host_memory,
                   MapHostMemory(caller, plan, call.wants));
  ASSIGN_OR_RETURN(RestoreOutputs out, PrepareOutputs(plan, call.wants, mapped, std::move(host_memory),
                                                      staging_, deadline, stream_while_reading));
  int64_t delivered = 0;
  for (const RestoreItem& item : plan.items) delivered += item.bytes;
  header_message.mutable_header()->set_bytes_delivered(delivered);
  RETURN_IF_ERROR(ReadAndSend(call, *reader, plan, *reads, header_message, stream_while_reading,
                              announce_while_reading, deadline, out, sink));
  Record(call, plan, step, caller, *reads,
         trainer_memory != nullptr ? " (into the trainer's memory)"
         : mapped != nullptr       ? " (shared memory)"
                                   : "",
         delivered, started);
  return absl::OkStatus();
}

absl::Status Restorer::ReadAndSend(const RestoreCall& call, BundleReader& reader, const RestorePlan& plan,
                                   const StorageTiers::StepReads& reads, v1::RestoreResponse& header_message,
                                   bool stream_while_reading, bool announce_while_reading,
                                   absl::Time deadline, RestoreOutputs& out, RestoreSink* sink) {
  if (stream_while_reading || announce_while_reading) {
    RETURN_IF_ERROR(sink->Send(header_message));
    if (stream_while_reading) {
      RETURN_IF_ERROR(ReadAndStream(reader, plan, staging_, deadline, options_.read_threads, out, sink));
    } else {
      RETURN_IF_ERROR(ReadAndAnnounce(reader, plan, out, options_.read_threads, sink));
    }
    v1::RestoreResponse trailer;
    trailer.mutable_trailer()->set_storage_bytes_read(static_cast<int64_t>(reads.storage_bytes()));
    trailer.mutable_trailer()->set_peer_bytes_received(static_cast<int64_t>(reads.peer_bytes()));
    return sink->Send(trailer);
  }
  RETURN_IF_ERROR(ReadPlan(reader, plan, out.destinations, options_.read_threads));
  v1::RestoreHeader& header = *header_message.mutable_header();
  header.set_storage_bytes_read(static_cast<int64_t>(reads.storage_bytes()));
  header.set_peer_bytes_received(static_cast<int64_t>(reads.peer_bytes()));
  for (size_t i = 0; i < plan.items.size(); ++i) {
    if (!call.wants.devices[i].has_value()) continue;
    if (absl::Status s = device_->CopyToDevice(out.device_buffers[i], *call.wants.devices[i]); !s.ok()) {
      return Annotate(s, absl::StrCat("tensor '", plan.items[i].info.name, "'"));
    }
    out.device_buffers[i] = StagedBuffer();
  }
  RETURN_IF_ERROR(sink->Send(header_message));
  return SendChunks(out, 0, out.streamed.size(), sink);
}

void Restorer::Record(const RestoreCall& call, const RestorePlan& plan, int64_t step,
                      const RestoreCaller& caller, const StorageTiers::StepReads& reads, const char* delivery,
                      int64_t delivered, absl::Time started) {
  peer_bytes_ += reads.peer_bytes();
  bytes_delivered_ += static_cast<uint64_t>(delivered);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - started);
  LogEvent(
      spdlog::level::info,
      {.run = call.run, .step = step, .trainer = call.trainer_id, .bytes = delivered, .seconds = seconds},
      "run '{}' step {} restored for {} (trainer {}): {} tensor(s), {} bytes delivered in {:.3f} s "
      "({:.0f} MB/s); {} bytes read from storage, {} from peers{}",
      call.run, step, caller.describe(), call.trainer_id, plan.items.size(), delivered, seconds,
      seconds > 0 ? static_cast<double>(delivered) / seconds / 1e6 : 0.0, reads.storage_bytes(),
      reads.peer_bytes(), delivery);
  if (metrics_ != nullptr) {
    const Metrics::Labels run = {{"run", call.run}};
    metrics_->Count("ckptd_restores_total", run);
    metrics_->Count("ckptd_restore_bytes_delivered_total", run, static_cast<double>(delivered));
    metrics_->Count("ckptd_restore_storage_bytes_read_total", run,
                    static_cast<double>(reads.storage_bytes()));
    metrics_->Observe("ckptd_restore_seconds", run, seconds);
  }
  if (spdlog::should_log(spdlog::level::debug)) {
    for (const RestoreItem& item : plan.items) {
      std::vector<std::string> boxes;
      for (const Box& box : item.boxes) boxes.push_back(box.ToString());
      spdlog::debug("run '{}' step {}: restored '{}' {} as {} ({} bytes)", call.run, step, item.info.name,
                    absl::StrJoin(boxes, " "), DataTypeName(item.dtype), item.bytes);
    }
  }
}

absl::StatusOr<std::unique_ptr<TrainerMemory>> Restorer::OpenTrainerMemory(const RestoreCall& call,
                                                                           const RestoreCaller& caller,
                                                                           const RestorePlan& plan,
                                                                           bool send_header_first) {
  const std::vector<std::vector<AddressRange>>& ranges = call.wants.process_memory;
  const bool any_named = absl::c_any_of(ranges, [](const auto& r) { return !r.empty(); });
  if (!any_named) return nullptr;
  std::optional<uint64_t> probe;
  bool all_named = true;
  for (size_t i = 0; i < plan.items.size(); ++i) {
    int64_t named = 0;
    for (const AddressRange& range : ranges[i]) {
      named += range.size;
      if (range.size > 0 && !probe.has_value()) probe = range.address;
    }
    if (!ranges[i].empty() && named != plan.items[i].bytes) {
      return absl::InvalidArgumentError(absl::StrCat("tensors[", i, "].process_memory: ranges of ", named,
                                                     " bytes in all, but tensor '", plan.items[i].info.name,
                                                     "' restores as ", plan.items[i].bytes));
    }
    if (ranges[i].empty() && plan.items[i].bytes > 0) all_named = false;
  }
  // Written while it is read, or not at all: a reply held back for fallback or
  // device memory, or one with tensors bound elsewhere, takes the segment. So does one
  // with a tensor larger than kMaxTrainerMemoryItem: each is read whole into staging
  // before it is written out, and a restore holds two groups of them at once (with
  // four trainers restoring 256 MiB tensors each, the daemons' staging outgrew a
  // 24 GiB machine).
  const bool small_items =
      absl::c_all_of(plan.items, [](const RestoreItem& item) { return item.bytes <= kMaxTrainerMemoryItem; });
  if (!options_.process_memory || !call.shared_memory.has_value() || !send_header_first || !all_named ||
      !probe.has_value() || !small_items ||
      absl::c_any_of(call.wants.host_memory, [](const auto& h) { return h.has_value(); })) {
    return nullptr;
  }
  ASSIGN_OR_RETURN(pid_t pid, caller.pid());
  absl::StatusOr<std::unique_ptr<TrainerMemory>> memory = TrainerMemory::Open(pid, *probe);
  if (memory.ok() || absl::IsInvalidArgument(memory.status()) || absl::IsCancelled(memory.status())) {
    return memory;
  }
  if (!told_no_process_memory_.exchange(true)) {
    spdlog::info("Restores go through trainers' shared-memory segments, not straight into their memory: {}",
                 std::string(memory.status().message()));
  }
  return nullptr;
}

TrainerMemorySink::TrainerMemorySink(const TrainerMemory* memory,
                                     const std::vector<std::vector<AddressRange>>* ranges,
                                     RestoreSink* replies)
    : memory_(memory), ranges_(ranges), replies_(replies) {}

absl::Status TrainerMemorySink::Send(const v1::RestoreResponse& message) { return replies_->Send(message); }

absl::Status TrainerMemorySink::SendChunk(int32_t tensor_index, int64_t offset, absl::Span<const char> data) {
  // The chunk's bytes belong at `offset` of the tensor's ranges laid end to end.
  for (const AddressRange& range : (*ranges_)[static_cast<size_t>(tensor_index)]) {
    if (data.empty()) break;
    if (offset >= range.size) {
      offset -= range.size;
      continue;
    }
    const size_t take = std::min(data.size(), static_cast<size_t>(range.size - offset));
    RETURN_IF_ERROR(memory_->Write(range.address + static_cast<uint64_t>(offset), data.first(take)));
    data.remove_prefix(take);
    offset = 0;
  }
  if (!data.empty())
    return absl::InternalError("process_memory: a chunk past the end of its tensor's ranges");
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SharedSegment>> Restorer::MapReplySegment(const RestoreCall& call,
                                                                         const RestoreCaller& caller,
                                                                         const RestorePlan& plan) {
  if (!call.shared_memory.has_value()) return nullptr;
  ASSIGN_OR_RETURN(pid_t pid, caller.pid());
  const v1::SharedMemory& shm = *call.shared_memory;
  if (shm.size() < plan.shared_memory_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("shared_memory.size: ", shm.size(),
                                                   " bytes, but the reply needs ", plan.shared_memory_bytes,
                                                   " (see describe_only)"));
  }
  return segments_->Open(pid, shm.fd(), shm.offset(), plan.shared_memory_bytes,
                         SharedSegment::Access::kWrite);
}

absl::StatusOr<std::vector<std::shared_ptr<SharedSegment>>> Restorer::MapHostMemory(
    const RestoreCaller& caller, const RestorePlan& plan, const RestoreWants& wants) {
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
      ASSIGN_OR_RETURN(pid, caller.pid());
    }
    absl::StatusOr<std::shared_ptr<SharedSegment>> mapped =
        segments_->Open(*pid, host.fd(), host.offset(), host.size(), SharedSegment::Access::kWrite);
    if (!mapped.ok()) return Annotate(mapped.status(), field);
    host_memory[i] = *std::move(mapped);
  }
  return host_memory;
}

absl::Status Restorer::CheckShardsHere(const BundleReader& reader, const std::string& step_dir) const {
  FileSystem* fs = tiers_->read_store()->fs();
  std::vector<std::string> elsewhere;
  absl::StatusOr<std::string> text =
      fs->ReadFileToString(JoinPath(step_dir, kCheckpointMetaFile), options_.max_index_bytes);
  absl::StatusOr<CheckpointMeta> meta =
      text.ok() ? CheckpointMeta::FromJson(*text) : absl::StatusOr<CheckpointMeta>(text.status());
  for (int shard = 0; shard < reader.header().num_shards(); ++shard) {
    if (fs->Exists(reader.DataFile(shard))) continue;
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
                                                    "(storage: local), and this job has no daemon there to "
                                                    "read them through: restore with a job that runs on "
                                                    "those hosts too, or keep checkpoints on storage: shared "
                                                    "or drain_to"));
}

}  // namespace ckptd
