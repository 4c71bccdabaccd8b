// The commit protocol of one step (Coordinator::CommitStep and its phases), on the
// coordinator's thread: plan, prepare, write, merge, publish and confirm, each ending
// in a vote; then retention. See coordinator.h for the phases and what OnExpiry may
// touch while they run; rounds and barriers are in coordinator.cc.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>
#include <set>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckptd/v1/wire.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/bundle/checkpoint_meta.h"
#include "daemon/bundle/crc32c.h"
#include "daemon/coord/coordinator.h"
#include "daemon/layout/mesh.h"

namespace ckptd {
namespace {

std::set<int> Everyone(int count) {
  std::set<int> ids;
  for (int t = 0; t < count; ++t) ids.insert(t);
  return ids;
}

// How many tensors the trainers staged, replicas included.
size_t StagedTensorCount(const std::vector<TrainerPayload>& payloads) {
  size_t count = 0;
  for (const TrainerPayload& p : payloads) count += p.tensors.size();
  return count;
}

// A staged box's name and extent, pointing into the staged tensor (or the plan).
struct StagedKey {
  absl::string_view name;
  const Box* box;
  friend bool operator==(const StagedKey& a, const StagedKey& b) {
    return a.name == b.name && *a.box == *b.box;
  }
  template <typename H>
  friend H AbslHashValue(H h, const StagedKey& k) {
    return H::combine(std::move(h), k.name, k.box->start, k.box->length);
  }
};

Box BoxOf(const google::protobuf::RepeatedField<int64_t>& start,
          const google::protobuf::RepeatedField<int64_t>& length) {
  return Box{{start.begin(), start.end()}, {length.begin(), length.end()}};
}

}  // namespace

absl::Status Coordinator::CommitStep(const StepKey& key, int trainer_count) {
  Attempt attempt{.key = key,
                  .trainer_count = trainer_count,
                  .started = absl::Now(),
                  .deadline = absl::Now() + options_.commit_timeout,
                  .payloads = registry_->TakeForCommit(key)};
  PhaseScope scope(&phase_, Phase{.steps = {key}});
  absl::StatusOr<SavePlan> plan;
  RETURN_IF_ERROR(PlanPhase(attempt, &plan));
  if (!plan.ok()) {
    spdlog::warn("run '{}' step {}: not committed: {}", key.run, key.step,
                 std::string(plan.status().message()));
    NotifyConcluded({.key = key, .status = plan.status()});
    failed_here_.erase(key);
    registry_->FinishStep(key, plan.status(), 0, absl::ZeroDuration(), Everyone(trainer_count));
    return absl::OkStatus();
  }
  attempt.plan = std::move(*plan);
  // Each phase does this rank's part, then every rank votes; the first failing vote
  // ends the attempt the same way on every rank. Publish and confirm are past the
  // point where a deadline may fail the step locally (see OnExpiry).
  using PhaseFn = absl::Status (Coordinator::*)(Attempt&, absl::Status*);
  struct Step {
    PhaseFn run;
    bool deadline_may_fail_it;
    const char* name;  // the phase label of ckptd_commit_phase_seconds
  };
  for (const Step& step :
       {Step{&Coordinator::PreparePhase, true, "prepare"}, Step{&Coordinator::WritePhase, true, "write"},
        Step{&Coordinator::ReplicatePhase, true, "replicate"}, Step{&Coordinator::MergePhase, true, "merge"},
        Step{&Coordinator::PublishPhase, false, "publish"},
        Step{&Coordinator::ConfirmPhase, false, "confirm"}}) {
    if (!step.deadline_may_fail_it) phase_.final_outcome = true;
    const absl::Time phase_started = absl::Now();
    absl::Status mine;
    RETURN_IF_ERROR((this->*step.run)(attempt, &mine));
    if (step.deadline_may_fail_it) mine = LocalStatus(key, mine);
    ASSIGN_OR_RETURN(attempt.agreed, Vote(Where(mine), attempt.deadline));
    for (CommitObserver* observer : observers_) observer->OnPhase(step.name, absl::Now() - phase_started);
    if (!attempt.agreed.ok()) {
      // Whoever published takes the step back: on local roots some ranks may have
      // published when another could not.
      if (attempt.published_here) Withdraw(key, attempt.agreed);
      break;
    }
  }
  Conclude(attempt);
  return absl::OkStatus();
}

absl::Status Coordinator::PlanPhase(Attempt& attempt, absl::StatusOr<SavePlan>* plan_out) {
  // Every rank learns every shard, then computes the same plan.
  internal::ShardList local;
  local.mutable_shards()->Reserve(static_cast<int>(StagedTensorCount(attempt.payloads)));
  for (const TrainerPayload& p : attempt.payloads) {
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
  if (absl::Status s = LocalStatus(attempt.key, absl::OkStatus()); !s.ok()) {
    local.set_failure(std::string(s.message()));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> all,
                   collective_->AllGather(local.SerializeAsString(), attempt.deadline));
  std::vector<internal::ShardList> lists(all.size());
  size_t total_shards = 0;
  for (size_t host = 0; host < all.size(); ++host) {
    lists[host].ParseFromString(all[host]);
    total_shards += static_cast<size_t>(lists[host].shards_size());
  }
  std::vector<ShardRef> shards;
  shards.reserve(total_shards);
  std::vector<TrainerDevices> trainers;
  absl::Status failed_somewhere = absl::OkStatus();
  for (int host = 0; host < static_cast<int>(all.size()); ++host) {
    internal::ShardList& list = lists[host];
    if (!list.failure().empty() && failed_somewhere.ok()) {
      failed_somewhere = absl::DeadlineExceededError(list.failure());
    }
    // Names and specs are moved out of the parsed lists, which are dropped after this.
    for (internal::Shard& s : *list.mutable_shards()) {
      shards.push_back({.name = std::move(*s.mutable_name()),
                        .dtype = s.dtype(),
                        .shape = Shape(s.shape().begin(), s.shape().end()),
                        .box = BoxOf(s.start(), s.length()),
                        .host = host,
                        .trainer = s.trainer(),
                        .bytes = s.bytes(),
                        .has_layout = s.has_layout(),
                        .sharding_specs = {std::make_move_iterator(s.mutable_sharding_specs()->begin()),
                                           std::make_move_iterator(s.mutable_sharding_specs()->end())}});
    }
    for (const internal::TrainerDevices& t : list.trainers()) {
      trainers.push_back({.trainer = t.trainer(),
                          .host = host,
                          .mesh = t.mesh(),
                          .device_ids = {t.device_ids().begin(), t.device_ids().end()}});
    }
  }
  // A rank that already failed the step (its deadline passed, its staged bytes are
  // gone) decides the outcome: whatever the rest would plan, the step fails the same
  // way everywhere.
  absl::StatusOr<std::string> mesh = failed_somewhere.ok() ? CheckMeshCoverage(trainers) : failed_somewhere;
  absl::StatusOr<SavePlan> plan = mesh.ok() ? MakeSavePlan(shards, collective_->size()) : mesh.status();
  if (plan.ok()) plan->mesh = *mesh;
  *plan_out = std::move(plan);
  return absl::OkStatus();
}

absl::Status Coordinator::PreparePhase(Attempt& attempt, absl::Status* mine) {
  // The publisher(s) clear leftovers (this step's earlier attempt, and the first time
  // they see a run, temp directories orphaned by a crash) and create the temp directory.
  if (Publishes()) *mine = PrepareTempDir(attempt.key);
  return absl::OkStatus();
}

absl::Status Coordinator::PrepareTempDir(const StepKey& key) {
  if (cleaned_runs_.insert(key.run).second) {
    auto removed = store_->RemoveOrphans(key.run);
    if (!removed.ok()) {
      spdlog::warn("run '{}': cleaning orphans: {}", key.run, std::string(removed.status().message()));
    } else {
      for (const std::string& path : *removed) spdlog::warn("run '{}': removed orphaned {}", key.run, path);
    }
  }
  ASSIGN_OR_RETURN(bool committed, store_->Committed(key.run, key.step));
  if (committed) {
    return absl::AlreadyExistsError(
        absl::StrCat("run '", key.run, "' step ", key.step, " is already committed"));
  }
  return store_->BeginStep(key.run, key.step, "", options_.dir_mode, CheckpointStore::Begin::kFresh).status();
}

absl::Status Coordinator::WritePhase(Attempt& attempt, absl::Status* mine) {
  *mine = WriteLocalShard(attempt.key, attempt.plan, attempt.payloads, &attempt.entries, &attempt.bytes);
  attempt.payloads.clear();  // staged memory goes back as soon as the bytes are on disk
  return absl::OkStatus();
}

absl::Status Coordinator::ReplicatePhase(Attempt& attempt, absl::Status* mine) {
  // Every rank fetches the data files it keeps for others into its temp directory,
  // so that its publish renames them into place with its own; the vote that follows
  // makes the step wait for every copy, and a failed copy fails it everywhere.
  if (copier_ == nullptr) return absl::OkStatus();
  const int rank = collective_->rank(), ranks = collective_->size();
  const std::string prefix = CheckpointStore::Prefix(store_->TempDir(attempt.key.run, attempt.key.step));
  for (int shard = 0; shard < ranks && mine->ok(); ++shard) {
    const std::vector<int>& holders = replica_copies_[shard];
    if (std::find(holders.begin(), holders.end(), rank) == holders.end()) continue;
    const absl::Time started = absl::Now();
    const absl::Status copied =
        copier_->CopyStepFile(attempt.key, DataPath("ckpt", shard, ranks), shard, /*pending=*/true,
                              store_->fs(), DataPath(prefix, shard, ranks), attempt.deadline);
    if (!copied.ok()) *mine = Annotate(copied, absl::StrCat("replica of rank ", shard, "'s data file"));
    spdlog::debug("run '{}' step {}: copied rank {}'s data file in {}", attempt.key.run, attempt.key.step,
                  shard, absl::FormatDuration(absl::Now() - started));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::MergePhase(Attempt& attempt, absl::Status* mine) {
  // Rank 0 builds the index and ckptd.json from every rank's entries; every publisher
  // writes them into its temp directory; all vote once more before anything becomes
  // visible.
  ASSIGN_OR_RETURN(std::vector<std::string> gathered,
                   collective_->Gather(attempt.entries, 0, attempt.deadline));
  internal::StepFiles files;
  if (collective_->rank() == 0) {
    absl::StatusOr<internal::StepFiles> built =
        BuildStepFiles(attempt.key, attempt.trainer_count, attempt.plan, gathered, attempt.started);
    if (built.ok()) {
      files = *std::move(built);
    } else {
      files.set_failure(std::string(built.status().message()));
      *mine = built.status();
    }
  }
  if (options_.storage == Storage::kLocal) {
    ASSIGN_OR_RETURN(std::string bytes,
                     collective_->Broadcast(files.SerializeAsString(), 0, attempt.deadline));
    if (!files.ParseFromString(bytes)) return absl::InternalError("rank 0 sent an unparsable index");
  }
  // Without rank 0's files there is nothing to write; its own vote says why.
  if (Publishes() && files.failure().empty()) *mine = WriteStepFiles(attempt.key, files);
  return absl::OkStatus();
}

absl::Status Coordinator::PublishPhase(Attempt& attempt, absl::Status* mine) {
  if (Publishes()) {
    *mine = Publish(attempt.key);
    attempt.published_here = mine->ok();
  }
  return absl::OkStatus();
}

absl::Status Coordinator::ConfirmPhase(Attempt& attempt, absl::Status* mine) {
  // Every rank checks that it sees the published step, its own bytes included; only
  // this vote lets Wait report the step committed.
  *mine = CheckPublishedHere(attempt.key, attempt.bytes);
  return absl::OkStatus();
}

void Coordinator::Conclude(Attempt& attempt) {
  const StepKey& key = attempt.key;
  const absl::Status& agreed = attempt.agreed;
  failed_here_.erase(key);
  if (!agreed.ok() && Publishes()) {
    const std::string temp_dir = store_->TempDir(key.run, key.step);
    if (absl::Status s = store_->fs()->DeleteRecursively(temp_dir); !s.ok()) {
      spdlog::error("removing {}: {}", temp_dir, std::string(s.message()));
    }
  }
  if (agreed.ok()) {
    spdlog::info("run '{}' step {} committed in {} ({} bytes written here)", key.run, key.step,
                 absl::FormatDuration(absl::Now() - attempt.started), attempt.bytes);
  }
  NotifyConcluded({.key = key,
                   .status = agreed,
                   .bytes_written = agreed.ok() ? attempt.bytes : 0,
                   .took = absl::Now() - attempt.started,
                   .data_file = agreed.ok()
                                    ? DataPath(CheckpointStore::Prefix(store_->StepDir(key.run, key.step)),
                                               collective_->rank(), collective_->size())
                                    : ""});
  if (agreed.ok()) {
    if (Publishes()) {
      ApplyRetention(key);
      if (absl::Status s = store_->ClearLost(key.run, key.step); !s.ok()) {
        spdlog::warn("run '{}' step {}: {}", key.run, key.step, std::string(s.message()));
      }
    }
    if (options_.drainer != nullptr && collective_->rank() == 0) drain_runs_.insert(key.run);
  } else {
    spdlog::warn("run '{}' step {} failed: {}", key.run, key.step, std::string(agreed.message()));
  }
  registry_->FinishStep(key, agreed, agreed.ok() ? attempt.bytes : 0, absl::Now() - attempt.started,
                        Everyone(attempt.trainer_count));
}

void Coordinator::NotifyConcluded(const StepOutcome& outcome) {
  for (CommitObserver* observer : observers_) observer->OnConcluded(outcome);
}

absl::Status Coordinator::CheckPublishedHere(const StepKey& key, int64_t bytes_written) {
  const std::string step_dir = store_->StepDir(key.run, key.step);
  const std::string prefix = CheckpointStore::Prefix(step_dir);
  FileSystem* fs = store_->fs();
  ASSIGN_OR_RETURN(bool visible, store_->Committed(key.run, key.step));
  if (!visible) {
    return absl::FailedPreconditionError(absl::StrCat(
        "published ", step_dir, " is not visible here (no ", IndexPath(prefix), "): ",
        options_.storage == Storage::kLocal ? "this host's checkpoint root changed under the daemon"
                                            : "every daemon must see the same root"));
  }
  const std::string data = DataPath(prefix, collective_->rank(), collective_->size());
  absl::StatusOr<uint64_t> size = fs->FileSize(data);
  if (!size.ok() || *size != static_cast<uint64_t>(bytes_written)) {
    return absl::DataLossError(
        absl::StrCat("published ", data, " is ",
                     size.ok() ? absl::StrCat(*size, " bytes") : std::string(size.status().message()),
                     " here, but this rank wrote ", bytes_written));
  }
  return absl::OkStatus();
}

void Coordinator::Withdraw(const StepKey& key, const absl::Status& why) {
  spdlog::error("run '{}' step {}: withdrawing {}: {}", key.run, key.step, store_->StepDir(key.run, key.step),
                std::string(why.message()));
  TakeBack(key);
}

void Coordinator::TakeBack(const StepKey& key) {
  // The state file forgets the step before the step goes: a crash in between leaves a
  // visible step the state file does not name, never the reverse.
  FileSystem* fs = store_->fs();
  const std::string step_dir = store_->StepDir(key.run, key.step);
  if (absl::Status s = store_->WriteStateFile(key.run, key.step); !s.ok()) {
    spdlog::error("withdrawing {}: state file: {}", step_dir, std::string(s.message()));
  }
  if (absl::Status s = fs->Rename(step_dir, store_->TempDir(key.run, key.step)); !s.ok()) {
    spdlog::error("withdrawing {}: {}", step_dir, std::string(s.message()));
  }
  fs->SyncDir(store_->RunDir(key.run)).IgnoreError();
}

void Coordinator::ApplyRetention(const StepKey& key) {
  if (options_.keep_last <= 0 && options_.keep_every_n_steps <= 0) return;
  std::set<int64_t> protect;
  for (const StepKey& r : restoring_) {
    if (r.run == key.run) protect.insert(r.step);
  }
  // The step being drained stays until the drain has it.
  if (drain_seen_.seq() != 0 && drain_seen_.run() == key.run) protect.insert(drain_seen_.step());
  auto removed = store_->ApplyRetention(key.run, options_.keep_last, options_.keep_every_n_steps, protect,
                                        /*dry_run=*/false);
  if (!removed.ok()) {
    spdlog::warn("run '{}': retention: {}", key.run, std::string(removed.status().message()));
  } else if (!removed->empty()) {
    spdlog::info("run '{}': retention removed step(s) {}", key.run, absl::StrJoin(*removed, ","));
    for (CommitObserver* observer : observers_) observer->OnRemoved(key.run, *removed);
  }
}

namespace {

// One box this rank writes: its place in the plan and the staged bytes it holds.
struct WriteJob {
  const PlannedTensor* tensor;
  const PlannedBox* box;
  StagedTensor* staged;
};

// What this rank writes, in plan order; every other staged box (written by another
// host, or a second local replica) goes back to staging memory now. INTERNAL when the
// plan gives this rank a box it does not hold.
absl::StatusOr<std::vector<WriteJob>> PickLocalBoxes(const SavePlan& plan,
                                                     std::vector<TrainerPayload>& payloads, int rank) {
  // Looked up in place by name and box: a tree of copied names (and a tree of the
  // boxes used) took over a third of the write phase's CPU time at 100,000 tensors.
  absl::flat_hash_map<StagedKey, StagedTensor*> staged;
  const size_t staged_count = StagedTensorCount(payloads);
  staged.reserve(staged_count);
  for (TrainerPayload& p : payloads) {
    for (StagedTensor& t : p.tensors) staged.emplace(StagedKey{t.name, &t.box}, &t);
  }
  std::vector<WriteJob> jobs;
  absl::flat_hash_set<const StagedTensor*> used;
  used.reserve(staged_count);
  for (const PlannedTensor& t : plan.tensors) {
    for (const PlannedBox& b : t.boxes) {
      if (b.writer != rank) continue;
      auto it = staged.find(StagedKey{t.name, &b.box});
      if (it == staged.end()) {
        return absl::InternalError(absl::StrCat("plan assigned box ", b.box.ToString(), " of '", t.name,
                                                "' to rank ", rank, ", which does not hold it"));
      }
      jobs.push_back({.tensor = &t, .box = &b, .staged = it->second});
      used.insert(it->second);
    }
  }
  for (TrainerPayload& p : payloads) {
    for (StagedTensor& t : p.tensors) {
      if (used.count(&t) == 0) t.bytes = StagedBuffer();
    }
  }
  return jobs;
}

// The index entries of what this rank wrote, for rank 0's merge.
internal::WrittenEntries EntriesOf(const std::vector<WriteJob>& jobs,
                                   const std::vector<DataFileWriter::Written>& written, int rank) {
  internal::WrittenEntries entries;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const WriteJob& j = jobs[i];
    internal::WrittenEntry* e = entries.add_entries();
    e->set_name(j.tensor->name);
    e->set_dtype(j.tensor->dtype);
    e->mutable_shape()->Add(j.tensor->shape.begin(), j.tensor->shape.end());
    e->mutable_start()->Add(j.box->box.start.begin(), j.box->box.start.end());
    e->mutable_length()->Add(j.box->box.length.begin(), j.box->box.length.end());
    e->set_shard(rank);
    e->set_offset(written[i].offset);
    e->set_size(j.box->bytes);
    e->set_crc32c(written[i].crc32c);
  }
  return entries;
}

}  // namespace

absl::Status Coordinator::WriteLocalShard(const StepKey& key, const SavePlan& plan,
                                          std::vector<TrainerPayload>& payloads, std::string* entries_out,
                                          int64_t* bytes_out) {
  const absl::Time started = absl::Now();
  const int rank = collective_->rank();
  ASSIGN_OR_RETURN(const std::vector<WriteJob> jobs, PickLocalBoxes(plan, payloads, rank));
  const bool observers_take_buffers =
      absl::c_any_of(observers_, [](const CommitObserver* o) { return o->TakesWrittenBuffers(); });
  std::vector<DataFileEntry> pieces;
  pieces.reserve(jobs.size());
  for (const WriteJob& j : jobs) {
    StagedTensor* s = j.staged;
    pieces.push_back({.dtype = j.tensor->dtype,
                      .elements = j.box->box.NumElements(),
                      .bytes = absl::string_view(s->bytes.data(), static_cast<size_t>(s->bytes.size())),
                      .done = [s, keep = observers_take_buffers] {
                        if (!keep) s->bytes = StagedBuffer();
                      }});
  }
  // A failed write leaves the boxes it did not reach staged: the payloads free them
  // when they go.
  int64_t file_bytes = 0;
  ASSIGN_OR_RETURN(std::vector<DataFileWriter::Written> written,
                   WriteDataFile(store_->fs(),
                                 DataPath(CheckpointStore::Prefix(store_->TempDir(key.run, key.step)), rank,
                                          collective_->size()),
                                 pieces, options_.checksum_threads, &file_bytes));
  if (observers_take_buffers) {
    std::vector<WrittenBox> boxes;
    boxes.reserve(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) {
      boxes.push_back({.tensor = jobs[i].tensor->name,
                       .dtype = jobs[i].tensor->dtype,
                       .elements = jobs[i].box->box.NumElements(),
                       .offset = static_cast<uint64_t>(written[i].offset),
                       .crc32c = written[i].crc32c,
                       .bytes = &jobs[i].staged->bytes});
    }
    for (CommitObserver* observer : observers_) observer->OnWritten(key, boxes);
  }
  internal::WrittenEntries entries = EntriesOf(jobs, written, rank);
  entries.set_file_bytes(file_bytes);
  entries.set_write_seconds(absl::ToDoubleSeconds(absl::Now() - started));
  entries.set_host(HostName());
  *entries_out = entries.SerializeAsString();
  *bytes_out = file_bytes;
  return absl::OkStatus();
}

namespace {

// The index entries of tensor `t`'s boxes, from the hosts' reports of it (`reports`:
// every report naming `t`, in host order: of two reports of one box, the later
// host's counts).
absl::StatusOr<std::vector<std::pair<Box, tf::BundleEntryProto>>> EntriesOfBoxes(
    const PlannedTensor& t, absl::Span<const internal::WrittenEntry* const> reports) {
  std::vector<std::pair<Box, tf::BundleEntryProto>> pieces;
  pieces.reserve(t.boxes.size());
  for (const PlannedBox& b : t.boxes) {
    const internal::WrittenEntry* where = nullptr;
    for (const internal::WrittenEntry* e : reports) {
      if (absl::c_equal(e->start(), b.box.start) && absl::c_equal(e->length(), b.box.length)) where = e;
    }
    if (where == nullptr) {
      return absl::InternalError(
          absl::StrCat("no host reported writing box ", b.box.ToString(), " of '", t.name, "'"));
    }
    tf::BundleEntryProto e;
    e.set_shard_id(where->shard());
    e.set_offset(where->offset());
    e.set_size(where->size());
    e.set_crc32c(where->crc32c());
    pieces.emplace_back(b.box, std::move(e));
  }
  return pieces;
}

}  // namespace

absl::StatusOr<internal::StepFiles> Coordinator::BuildStepFiles(const StepKey& key, int trainer_count,
                                                                const SavePlan& plan,
                                                                const std::vector<std::string>& gathered,
                                                                absl::Time started) {
  const int num_shards = collective_->size();

  // Where each box's bytes landed: every host's reports, sorted by tensor name and
  // searched in place (building a map of copies of 100,000 entries, and freeing it,
  // was most of the merge).
  std::vector<internal::WrittenEntries> lists(gathered.size());
  std::vector<const internal::WrittenEntry*> located;
  CheckpointMeta meta{.version = options_.version,
                      .run = key.run,
                      .step = key.step,
                      .num_hosts = num_shards,
                      .storage = std::string(StorageName(options_.storage)),
                      .trainer_count = trainer_count,
                      .mesh = plan.mesh,
                      .bytes_per_host = plan.bytes_per_host};
  for (int host = 0; host < static_cast<int>(gathered.size()); ++host) {
    internal::WrittenEntries& list = lists[host];
    if (!list.ParseFromString(gathered[host])) {
      return absl::InternalError(absl::StrCat("rank ", host, " sent unparsable index entries"));
    }
    for (const internal::WrittenEntry& e : list.entries()) located.push_back(&e);
    meta.hosts.push_back({.rank = host,
                          .host = list.host(),
                          .file = DataPath("ckpt", host, num_shards),
                          .bytes = list.file_bytes(),
                          .write_seconds = list.write_seconds(),
                          .copies = replica_copies_.empty() ? std::vector<int>() : replica_copies_[host]});
    meta.max_write_seconds = std::max(meta.max_write_seconds, list.write_seconds());
  }

  // Stable: of two reports of one box, the later host's counts.
  std::stable_sort(
      located.begin(), located.end(),
      [](const internal::WrittenEntry* a, const internal::WrittenEntry* b) { return a->name() < b->name(); });
  IndexBuilder index(num_shards);
  const absl::StatusOr<Mesh> mesh = plan.mesh.empty() ? absl::NotFoundError("no mesh") : ParseMesh(plan.mesh);
  meta.tensors.reserve(plan.tensors.size());
  for (const PlannedTensor& t : plan.tensors) {
    CheckpointMeta::Tensor tensor{.name = t.name, .dtype = DataTypeName(t.dtype), .shape = t.shape};
    for (const PlannedBox& b : t.boxes) tensor.boxes.push_back({.box = b.box, .writer = b.writer});
    if (t.has_layout && mesh.ok()) tensor.layout = Layout{t.sharding_specs, *mesh}.ToString();
    meta.tensors.push_back(std::move(tensor));

    const auto first = std::lower_bound(
        located.begin(), located.end(), t.name,
        [](const internal::WrittenEntry* e, const std::string& name) { return e->name() < name; });
    const auto last = std::upper_bound(
        first, located.end(), t.name,
        [](const std::string& name, const internal::WrittenEntry* e) { return name < e->name(); });
    ASSIGN_OR_RETURN(
        auto pieces,
        EntriesOfBoxes(t, absl::MakeConstSpan(located.data() + (first - located.begin()), last - first)));
    RETURN_IF_ERROR(index.AddTensor(t.name, t.dtype, t.shape, std::move(pieces)));
  }
  ASSIGN_OR_RETURN(std::string index_bytes, index.Finish());

  meta.created_unix = absl::ToUnixSeconds(absl::Now());
  meta.commit_seconds = absl::ToDoubleSeconds(absl::Now() - started);
  internal::StepFiles files;
  files.set_index(std::move(index_bytes));
  files.set_meta(meta.ToJson());
  return files;
}

absl::Status Coordinator::WriteStepFiles(const StepKey& key, const internal::StepFiles& files) {
  const std::string temp_dir = store_->TempDir(key.run, key.step);
  FileSystem* fs = store_->fs();
  for (const auto& [path, contents] :
       {std::make_pair(IndexPath(CheckpointStore::Prefix(temp_dir)), files.index()),
        std::make_pair(JoinPath(temp_dir, kCheckpointMetaFile), files.meta())}) {
    ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs->NewWritableFile(path));
    RETURN_IF_ERROR(file->Append(contents));
    RETURN_IF_ERROR(file->Sync());
    RETURN_IF_ERROR(file->Close());
  }
  return fs->SyncDir(temp_dir);
}

absl::Status Coordinator::Publish(const StepKey& key) {
  bool renamed = false;
  const absl::Status s = store_->PublishStep(store_->TempDir(key.run, key.step), key.run, key.step,
                                             /*sync_contents=*/false, &renamed);
  if (s.ok() || !renamed) return s;
  // Not durably published: take it back so that nothing reports a failed step.
  spdlog::error("run '{}' step {}: publish failed ({}); withdrawing it", key.run, key.step,
                std::string(s.message()));
  TakeBack(key);
  return s;
}

}  // namespace ckptd
