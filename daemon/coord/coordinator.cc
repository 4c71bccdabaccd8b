#include "daemon/coord/coordinator.h"

#include <spdlog/spdlog.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/bundle/crc32c.h"
#include "daemon/bundle/ordered_code.h"
#include "daemon/layout/mesh.h"

namespace ckptd {
namespace {

constexpr uint32_t kDirMode = 0755;

internal::Vote ToVote(const absl::Status& s) {
  internal::Vote v;
  v.set_code(static_cast<int>(s.code()));
  v.set_message(std::string(s.message()));
  return v;
}

absl::Status FromVote(const internal::Vote& v) {
  return absl::Status(static_cast<absl::StatusCode>(v.code()), v.message());
}

Box BoxOf(const google::protobuf::RepeatedField<int64_t>& start,
          const google::protobuf::RepeatedField<int64_t>& length) {
  return Box{{start.begin(), start.end()}, {length.begin(), length.end()}};
}

}  // namespace

absl::Status Coordinator::Run(const std::atomic<bool>& stop) {
  spdlog::info("coordinator: {} rank(s), commit timeout {}", collective_->size(),
               absl::FormatDuration(options_.commit_timeout));
  absl::Duration idle_nap = absl::Microseconds(500);
  while (true) {
    bool stopping = false;
    absl::StatusOr<bool> worked = Round(stop.load(), &stopping);
    if (!worked.ok()) {
      registry_->FailEverything(worked.status());
      return worked.status();
    }
    if (stopping) {
      registry_->FailEverything(absl::UnavailableError("ckptd is shutting down; step not committed"));
      spdlog::info("coordinator: all ranks stopping");
      return absl::OkStatus();
    }
    registry_->DropCancelledWaiters();
    // Ranks run rounds in lockstep, so an idle rank naps between them; the nap
    // resets as soon as there is work, keeping Wait latency to about a millisecond.
    if (*worked) {
      idle_nap = absl::Microseconds(500);
    } else {
      absl::SleepFor(idle_nap);
      idle_nap = std::min(idle_nap * 2, absl::Milliseconds(5));
    }
  }
}

absl::StatusOr<bool> Coordinator::Round(bool stop_requested, bool* stopping) {
  internal::RoundState mine = registry_->Snapshot();
  mine.set_stopping(stop_requested);
  const bool busy = mine.steps_size() > 0 || mine.barriers_size() > 0;
  // An idle rank has nothing to time out; a rank with work waits at most commit_timeout.
  const absl::Time deadline = busy ? absl::Now() + options_.commit_timeout : absl::InfiniteFuture();
  ASSIGN_OR_RETURN(std::vector<std::string> all, collective_->AllGather(mine.SerializeAsString(), deadline));

  struct StepTally {
    std::set<int> counts;
    int staged = 0;
    int64_t mesh_size = 0;
  };
  std::map<StepKey, StepTally> steps;
  std::map<std::pair<std::string, int64_t>, StepTally> barriers;
  for (const std::string& bytes : all) {
    internal::RoundState state;
    if (!state.ParseFromString(bytes)) return absl::InternalError("a rank sent an unparsable round state");
    if (state.stopping()) *stopping = true;
    for (const auto& p : state.steps()) {
      StepTally& t = steps[{p.run(), p.step()}];
      t.counts.insert(p.trainer_count());
      t.staged += p.staged();
    }
    for (const auto& b : state.barriers()) {
      StepTally& t = barriers[{b.run(), b.barrier_id()}];
      t.counts.insert(b.trainer_count());
      t.staged += b.arrived();
      t.mesh_size = std::max(t.mesh_size, b.mesh_size());
    }
  }
  if (*stopping) return true;

  bool worked = false;
  // Every rank iterates the same sorted maps, so all start the same commits in order.
  for (const auto& [key, tally] : steps) {
    const int count = *tally.counts.rbegin();
    if (tally.counts.size() > 1) {
      worked = true;
      registry_->TakeForCommit(key);
      registry_->FinishStep(key, absl::InvalidArgumentError(absl::StrCat(
                                     "run '", key.run, "' step ", key.step,
                                     ": trainers disagree on trainer_count across hosts")), 0);
    } else if (tally.staged > count) {
      worked = true;
      registry_->TakeForCommit(key);
      registry_->FinishStep(key, absl::InvalidArgumentError(absl::StrCat(
                                     "run '", key.run, "' step ", key.step, ": ", tally.staged,
                                     " trainers staged but trainer_count is ", count,
                                     " (a trainer id is used twice)")), 0);
    } else if (tally.staged == count) {
      worked = true;
      RETURN_IF_ERROR(CommitStep(key, count));
    }
  }
  for (const auto& [key, tally] : barriers) {
    if (tally.counts.size() > 1 || tally.staged < *tally.counts.rbegin()) continue;
    worked = true;
    const absl::Time deadline = absl::Now() + options_.commit_timeout;
    // As DTensor's barrier does: the devices declared on all hosts must make up the mesh.
    int64_t local_devices = 0;
    for (const auto& b : mine.barriers()) {
      if (b.run() == key.first && b.barrier_id() == key.second) local_devices = b.devices();
    }
    ASSIGN_OR_RETURN(int64_t devices, collective_->AllReduceSum(local_devices, deadline));
    RETURN_IF_ERROR(collective_->Barrier(deadline));
    absl::Status outcome = absl::OkStatus();
    if (tally.staged != *tally.counts.rbegin()) {
      outcome = absl::InvalidArgumentError(absl::StrCat("barrier ", key.second, " of run '", key.first, "': ",
                                                        tally.staged, " arrivals for ", *tally.counts.rbegin(),
                                                        " trainers"));
    } else if (tally.mesh_size > 0 && devices != tally.mesh_size) {
      outcome = absl::FailedPreconditionError(absl::StrCat(
          "barrier ", key.second, " of run '", key.first, "': trainers on all hosts declared ", devices,
          " devices but the mesh has ", tally.mesh_size));
    }
    registry_->FinishBarrier(key.first, key.second, outcome);
  }
  return worked;
}

absl::StatusOr<absl::Status> Coordinator::Vote(const absl::Status& mine, absl::Time deadline) {
  const int size = collective_->size();
  ASSIGN_OR_RETURN(int first_failed, collective_->AllReduceMin(mine.ok() ? size : collective_->rank(), deadline));
  if (first_failed == size) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string vote, collective_->Broadcast(ToVote(mine).SerializeAsString(), first_failed, deadline));
  internal::Vote parsed;
  parsed.ParseFromString(vote);
  return FromVote(parsed);
}

absl::Status Coordinator::CommitStep(const StepKey& key, int trainer_count) {
  const absl::Time started = absl::Now();
  const absl::Time deadline = started + options_.commit_timeout;
  const int rank = collective_->rank();
  std::vector<TrainerPayload> payloads = registry_->TakeForCommit(key);

  // Plan: every rank learns every shard, then computes the same plan.
  internal::ShardList local;
  for (const TrainerPayload& p : payloads) {
    for (const StagedTensor& t : p.tensors) {
      internal::Shard* s = local.add_shards();
      s->set_name(t.name);
      s->set_dtype(t.dtype);
      s->mutable_shape()->Add(t.shape.begin(), t.shape.end());
      s->mutable_start()->Add(t.box.start.begin(), t.box.start.end());
      s->mutable_length()->Add(t.box.length.begin(), t.box.length.end());
      s->set_trainer(p.trainer_id);
      s->set_bytes(t.bytes.size());
      s->set_has_layout(t.has_layout);
      s->mutable_sharding_specs()->Add(t.sharding_specs.begin(), t.sharding_specs.end());
    }
    internal::TrainerDevices* d = local.add_trainers();
    d->set_trainer(p.trainer_id);
    d->set_mesh(p.mesh);
    d->mutable_device_ids()->Add(p.device_ids.begin(), p.device_ids.end());
  }
  ASSIGN_OR_RETURN(std::vector<std::string> all, collective_->AllGather(local.SerializeAsString(), deadline));
  std::vector<ShardRef> shards;
  std::vector<TrainerDevices> trainers;
  for (int host = 0; host < static_cast<int>(all.size()); ++host) {
    internal::ShardList list;
    list.ParseFromString(all[host]);
    for (const internal::Shard& s : list.shards()) {
      shards.push_back({s.name(), s.dtype(), Shape(s.shape().begin(), s.shape().end()),
                        BoxOf(s.start(), s.length()), host, s.trainer(), s.bytes(), s.has_layout(),
                        std::vector<std::string>(s.sharding_specs().begin(), s.sharding_specs().end())});
    }
    for (const internal::TrainerDevices& t : list.trainers()) {
      trainers.push_back({t.trainer(), host, t.mesh(), {t.device_ids().begin(), t.device_ids().end()}});
    }
  }
  absl::StatusOr<std::string> mesh = CheckMeshCoverage(trainers);
  absl::StatusOr<SavePlan> plan = mesh.ok() ? MakeSavePlan(shards, collective_->size()) : mesh.status();
  if (plan.ok()) plan->mesh = *mesh;
  if (!plan.ok()) {
    spdlog::warn("run '{}' step {}: plan rejected: {}", key.run, key.step, std::string(plan.status().message()));
    registry_->FinishStep(key, plan.status(), 0);
    return absl::OkStatus();
  }

  // Rank 0 clears any leftover of an earlier attempt and creates the temp directory.
  const std::string temp_dir = store_->TempDir(key.run, key.step);
  absl::Status prepared = absl::OkStatus();
  if (rank == 0) {
    if (store_->IsCommitted(key.run, key.step)) {
      prepared = absl::AlreadyExistsError(absl::StrCat("run '", key.run, "' step ", key.step, " is already committed"));
    } else {
      prepared = store_->fs()->DeleteRecursively(temp_dir);
      if (prepared.ok()) prepared = store_->fs()->CreateDirs(temp_dir, kDirMode);
    }
  }
  ASSIGN_OR_RETURN(absl::Status agreed, Vote(prepared, deadline));

  // Write this host's boxes, then vote on "all written and synced".
  std::string entries;
  int64_t bytes = 0;
  absl::Status written = agreed;
  if (agreed.ok()) written = WriteLocalShard(key, *plan, payloads, &entries, &bytes);
  payloads.clear();  // staged memory goes back as soon as the bytes are on disk
  ASSIGN_OR_RETURN(agreed, Vote(written, deadline));

  absl::Status published = agreed;
  if (agreed.ok()) {
    ASSIGN_OR_RETURN(std::vector<std::string> gathered, collective_->Gather(entries, 0, deadline));
    if (rank == 0) published = MergeAndPublish(key, trainer_count, *plan, gathered, started);
    ASSIGN_OR_RETURN(agreed, Vote(published, deadline));
  }
  if (!agreed.ok() && rank == 0) {
    if (absl::Status s = store_->fs()->DeleteRecursively(temp_dir); !s.ok()) {
      spdlog::error("removing {}: {}", temp_dir, std::string(s.message()));
    }
  }
  if (agreed.ok()) {
    spdlog::info("run '{}' step {} committed in {} ({} bytes written here)", key.run, key.step,
                 absl::FormatDuration(absl::Now() - started), bytes);
  } else {
    spdlog::warn("run '{}' step {} failed: {}", key.run, key.step, std::string(agreed.message()));
  }
  registry_->FinishStep(key, agreed, agreed.ok() ? bytes : 0);
  return absl::OkStatus();
}

absl::Status Coordinator::WriteLocalShard(const StepKey& key, const SavePlan& plan,
                                          const std::vector<TrainerPayload>& payloads,
                                          std::string* entries_out, int64_t* bytes_out) {
  const absl::Time started = absl::Now();
  const int rank = collective_->rank();
  std::map<std::pair<std::string, Box>, const StagedTensor*> staged;
  for (const TrainerPayload& p : payloads) {
    for (const StagedTensor& t : p.tensors) staged.emplace(std::make_pair(t.name, t.box), &t);
  }
  const std::string path =
      DataPath(CheckpointStore::Prefix(store_->TempDir(key.run, key.step)), rank, collective_->size());
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, store_->fs()->NewWritableFile(path));
  internal::WrittenEntries written;
  int64_t offset = 0;
  for (const PlannedTensor& t : plan.tensors) {
    for (const PlannedBox& b : t.boxes) {
      if (b.writer != rank) continue;
      auto it = staged.find({t.name, b.box});
      if (it == staged.end()) {
        return absl::InternalError(absl::StrCat("plan assigned box ", b.box.ToString(), " of '", t.name,
                                                "' to rank ", rank, ", which does not hold it"));
      }
      const StagedBuffer& bytes = it->second->bytes;
      RETURN_IF_ERROR(file->Append(absl::string_view(bytes.data(), static_cast<size_t>(bytes.size()))));
      internal::WrittenEntry* e = written.add_entries();
      e->set_name(t.name);
      e->set_dtype(t.dtype);
      e->mutable_shape()->Add(t.shape.begin(), t.shape.end());
      e->mutable_start()->Add(b.box.start.begin(), b.box.start.end());
      e->mutable_length()->Add(b.box.length.begin(), b.box.length.end());
      e->set_shard(rank);
      e->set_offset(offset);
      e->set_size(bytes.size());
      ASSIGN_OR_RETURN(uint32_t crc, EntryChecksum(t.dtype, b.box.NumElements(), bytes.data(),
                                                   static_cast<size_t>(bytes.size())));
      e->set_crc32c(crc);
      offset += bytes.size();
    }
  }
  RETURN_IF_ERROR(file->Sync());
  RETURN_IF_ERROR(file->Close());
  RETURN_IF_ERROR(store_->fs()->SyncDir(DirName(path)));
  written.set_file_bytes(offset);
  written.set_write_seconds(absl::ToDoubleSeconds(absl::Now() - started));
  *entries_out = written.SerializeAsString();
  *bytes_out = offset;
  return absl::OkStatus();
}

absl::Status Coordinator::MergeAndPublish(const StepKey& key, int trainer_count, const SavePlan& plan,
                                          const std::vector<std::string>& gathered, absl::Time started) {
  const int num_shards = collective_->size();
  const std::string temp_dir = store_->TempDir(key.run, key.step);
  const std::string prefix = CheckpointStore::Prefix(temp_dir);

  // (name, box) -> where its bytes landed.
  std::map<std::pair<std::string, Box>, internal::WrittenEntry> located;
  nlohmann::json hosts = nlohmann::json::array();
  double max_write_seconds = 0;
  for (int host = 0; host < static_cast<int>(gathered.size()); ++host) {
    internal::WrittenEntries list;
    if (!list.ParseFromString(gathered[host])) {
      return absl::InternalError(absl::StrCat("rank ", host, " sent unparsable index entries"));
    }
    for (const internal::WrittenEntry& e : list.entries()) {
      located[{e.name(), BoxOf(e.start(), e.length())}] = e;
    }
    hosts.push_back({{"rank", host},
                     {"file", DataPath("ckpt", host, num_shards)},
                     {"bytes", list.file_bytes()},
                     {"write_seconds", list.write_seconds()}});
    max_write_seconds = std::max(max_write_seconds, list.write_seconds());
  }

  IndexBuilder index(num_shards);
  nlohmann::json tensors = nlohmann::json::array();
  for (const PlannedTensor& t : plan.tensors) {
    auto entry_for = [&](const PlannedBox& b) -> absl::StatusOr<tf::BundleEntryProto> {
      auto it = located.find({t.name, b.box});
      if (it == located.end()) {
        return absl::InternalError(absl::StrCat("no host reported writing box ", b.box.ToString(), " of '", t.name, "'"));
      }
      tf::BundleEntryProto e;
      e.set_dtype(t.dtype);
      *e.mutable_shape() = ShapeToProto(b.box.length);
      e.set_shard_id(it->second.shard());
      e.set_offset(it->second.offset());
      e.set_size(it->second.size());
      e.set_crc32c(it->second.crc32c());
      return e;
    };
    nlohmann::json boxes = nlohmann::json::array();
    for (const PlannedBox& b : t.boxes) {
      boxes.push_back({{"start", b.box.start}, {"length", b.box.length}, {"writer", b.writer}});
    }
    nlohmann::json tensor = {{"name", t.name}, {"dtype", DataTypeName(t.dtype)}, {"shape", t.shape}, {"boxes", boxes}};
    if (t.has_layout && !plan.mesh.empty()) {
      auto mesh = ParseMesh(plan.mesh);
      if (mesh.ok()) tensor["layout"] = Layout{t.sharding_specs, *mesh}.ToString();
    }
    tensors.push_back(std::move(tensor));

    if (t.boxes.size() == 1 && t.boxes[0].box.IsFull(t.shape)) {
      ASSIGN_OR_RETURN(tf::BundleEntryProto e, entry_for(t.boxes[0]));
      RETURN_IF_ERROR(index.Add(t.name, std::move(e)));
      continue;
    }
    // TF's sliced layout: the full-tensor entry lists slices and holds no bytes.
    tf::BundleEntryProto full;
    full.set_dtype(t.dtype);
    *full.mutable_shape() = ShapeToProto(t.shape);
    for (const PlannedBox& b : t.boxes) {
      *full.add_slices() = BoxToSliceProto(b.box, t.shape);
      ASSIGN_OR_RETURN(tf::BundleEntryProto e, entry_for(b));
      RETURN_IF_ERROR(index.Add(ordered_code::EncodeTensorNameSlice(t.name, b.box, t.shape), std::move(e)));
    }
    RETURN_IF_ERROR(index.Add(t.name, std::move(full)));
  }
  ASSIGN_OR_RETURN(std::string index_bytes, index.Finish());

  nlohmann::json meta = {
      {"format", "ckptd/1"},
      {"version", options_.version},
      {"run", key.run},
      {"step", key.step},
      {"num_hosts", num_shards},
      {"trainer_count", trainer_count},
      {"mesh", plan.mesh},
      {"created_unix", absl::ToUnixSeconds(absl::Now())},
      {"bytes_per_host", plan.bytes_per_host},
      {"hosts", hosts},
      {"tensors", tensors},
      {"timings", {{"max_write_seconds", max_write_seconds},
                   {"commit_seconds", absl::ToDoubleSeconds(absl::Now() - started)}}},
  };
  FileSystem* fs = store_->fs();
  for (const auto& [path, contents] :
       {std::make_pair(IndexPath(prefix), index_bytes), std::make_pair(JoinPath(temp_dir, "ckptd.json"), meta.dump(1))}) {
    ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs->NewWritableFile(path));
    RETURN_IF_ERROR(file->Append(contents));
    RETURN_IF_ERROR(file->Sync());
    RETURN_IF_ERROR(file->Close());
  }
  RETURN_IF_ERROR(fs->SyncDir(temp_dir));

  // Publish: one rename makes the step visible; then make the rename durable.
  const std::string step_dir = store_->StepDir(key.run, key.step);
  RETURN_IF_ERROR(fs->Rename(temp_dir, step_dir));
  RETURN_IF_ERROR(fs->SyncDir(store_->RunDir(key.run)));
  return store_->WriteStateFile(key.run);
}

}  // namespace ckptd
