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
#include "daemon/base/logging.h"
#include "daemon/base/status.h"
#include "daemon/base/units.h"
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

Box BoxOf(const google::protobuf::RepeatedField<int64_t>& start,
          const google::protobuf::RepeatedField<int64_t>& length) {
  return Box{{start.begin(), start.end()}, {length.begin(), length.end()}};
}

// A Shard's name, dtype, shape and box: what a staged tensor's descriptor and a
// planned box's share.
void SetShardBox(internal::Shard* s, const std::string& name, int dtype, const Shape& shape, const Box& box) {
  s->set_name(name);
  s->set_dtype(dtype);
  s->mutable_shape()->Add(shape.begin(), shape.end());
  s->mutable_start()->Add(box.start.begin(), box.start.end());
  s->mutable_length()->Add(box.length.begin(), box.length.end());
}

// Rank 0's plan from every rank's ShardList (its descriptors, indexed by rank).
absl::StatusOr<SavePlan> PlanFromShardLists(const std::vector<std::string>& all) {
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
  if (!failed_somewhere.ok()) return failed_somewhere;
  ASSIGN_OR_RETURN(std::string mesh, CheckMeshCoverage(trainers));
  ASSIGN_OR_RETURN(SavePlan plan, MakeSavePlan(shards, static_cast<int>(all.size())));
  plan.mesh = std::move(mesh);
  return plan;
}

// Each rank's share of `plan` (serialized LocalPlans, indexed by rank): the boxes it
// writes, or the plan's failure for every rank.
std::vector<std::string> LocalPlans(const absl::StatusOr<SavePlan>& plan, int ranks) {
  std::vector<internal::LocalPlan> parts(static_cast<size_t>(ranks));
  if (!plan.ok()) {
    for (internal::LocalPlan& part : parts) {
      part.set_failure_code(static_cast<int>(plan.status().code()));
      part.set_failure(std::string(plan.status().message()));
    }
  } else {
    for (const PlannedTensor& t : plan->tensors) {
      for (const PlannedBox& b : t.boxes) {
        internal::Shard* s = parts[static_cast<size_t>(b.writer)].add_boxes();
        SetShardBox(s, t.name, t.dtype, t.shape, b.box);
        s->set_bytes(b.bytes);
      }
    }
  }
  std::vector<std::string> out;
  out.reserve(parts.size());
  for (const internal::LocalPlan& part : parts) out.push_back(part.SerializeAsString());
  return out;
}

// The plan as rank `rank` writes it: its own boxes, grouped by tensor in plan order.
absl::StatusOr<SavePlan> FromLocalPlan(internal::LocalPlan& part, int rank) {
  if (part.failure_code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(part.failure_code()), part.failure());
  }
  SavePlan plan;
  for (internal::Shard& s : *part.mutable_boxes()) {
    if (plan.tensors.empty() || plan.tensors.back().name != s.name()) {
      plan.tensors.push_back({.name = std::move(*s.mutable_name()),
                              .dtype = s.dtype(),
                              .shape = Shape(s.shape().begin(), s.shape().end()),
                              .boxes = {},
                              .has_layout = false,
                              .sharding_specs = {}});
    }
    plan.tensors.back().boxes.push_back(
        {.box = BoxOf(s.start(), s.length()), .writer = rank, .bytes = s.bytes()});
  }
  return plan;
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
  const absl::Time plan_started = absl::Now();
  RETURN_IF_ERROR(PlanPhase(attempt, &plan));
  // The plan (every shard's descriptor gathered on rank 0, which plans alone) is what
  // grows with tensors x ranks there: shown beside the other phases, not only in a profile.
  for (CommitObserver* observer : observers_) observer->OnPhase("plan", absl::Now() - plan_started);
  if (!plan.ok()) {
    LogEvent(spdlog::level::err, {.run = key.run, .step = key.step}, "run '{}' step {}: not committed: {}",
             key.run, key.step, std::string(plan.status().message()));
    NotifyConcluded({.key = key, .status = plan.status()});
    failed_here_.erase(key);
    registry_->FinishStep(key, plan.status(), 0, absl::ZeroDuration(), Everyone(trainer_count));
    return absl::OkStatus();
  }
  attempt.plan = std::move(*plan);
  // Each phase does this rank's part, then every rank votes; the first failing vote
  // ends the attempt the same way on every rank. Publish and confirm are past the
  // point where a deadline may fail the step locally (see OnExpiry).
  // A rank that does not publish (shared storage, rank > 0) skips the publishers'
  // phases but votes in them.
  using PhaseFn = absl::Status (Coordinator::*)(Attempt&, absl::Status*);
  struct Step {
    PhaseFn run;
    bool deadline_may_fail_it;
    bool publishers_only;
    const char* name;  // the phase label of ckptd_commit_phase_seconds
  };
  for (const Step& step : {Step{&Coordinator::PreparePhase, true, true, "prepare"},
                           Step{&Coordinator::WritePhase, true, false, "write"},
                           Step{&Coordinator::ReplicatePhase, true, false, "replicate"},
                           Step{&Coordinator::ParityPhase, true, false, "parity"},
                           Step{&Coordinator::MergePhase, true, false, "merge"},
                           Step{&Coordinator::PublishPhase, false, true, "publish"},
                           Step{&Coordinator::ConfirmPhase, false, false, "confirm"}}) {
    if (!step.deadline_may_fail_it) phase_.final_outcome = true;
    const absl::Time phase_started = absl::Now();
    absl::Status mine;
    if (Publishes() || !step.publishers_only) RETURN_IF_ERROR((this->*step.run)(attempt, &mine));
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
  // Rank 0 learns every shard, makes the plan and hands each rank the boxes it writes:
  // a rank's share of the work and of the bytes sent stays its own tensors', however
  // many ranks there are (every rank making the whole plan cost each of them
  // ranks x tensors).
  internal::ShardList local;
  local.mutable_shards()->Reserve(static_cast<int>(StagedTensorCount(attempt.payloads)));
  for (const TrainerPayload& p : attempt.payloads) {
    for (const StagedTensor& t : p.tensors) {
      internal::Shard* s = local.add_shards();
      SetShardBox(s, t.name, t.dtype, t.shape, t.box);
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
                   collective_->Gather(local.SerializeAsString(), 0, attempt.deadline));
  std::vector<std::string> parts;
  if (collective_->rank() == 0) {
    absl::StatusOr<SavePlan> plan = PlanFromShardLists(all);
    all.clear();
    parts = LocalPlans(plan, collective_->size());
    *plan_out = std::move(plan);
  }
  ASSIGN_OR_RETURN(std::string part, collective_->Scatter(parts, 0, attempt.deadline));
  if (collective_->rank() == 0) return absl::OkStatus();
  internal::LocalPlan mine;
  if (!mine.ParseFromString(part)) return absl::InternalError("rank 0 sent an unparsable plan");
  *plan_out = FromLocalPlan(mine, collective_->rank());
  return absl::OkStatus();
}

absl::Status Coordinator::PreparePhase(Attempt& attempt, absl::Status* mine) {
  // The publisher(s) clear leftovers (this step's earlier attempt, and the first time
  // they see a run, temp directories orphaned by a crash) and create the temp directory.
  *mine = PrepareTempDir(attempt.key);
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
  if (copier_ == nullptr || replica_copies_.empty()) return absl::OkStatus();
  const int rank = collective_->rank(), ranks = collective_->size();
  const std::string prefix = CheckpointStore::Prefix(store_->TempDir(attempt.key.run, attempt.key.step));
  for (int shard = 0; shard < ranks && mine->ok(); ++shard) {
    const std::vector<int>& holders = replica_copies_[shard];
    if (std::find(holders.begin(), holders.end(), rank) == holders.end()) continue;
    const absl::Time started = absl::Now();
    const absl::Status copied =
        copier_->CopyStepFile(attempt.key, DataPath("ckpt", shard, ranks), shard, /*pending=*/true,
                              store_->fs(), DataPath(prefix, shard, ranks), attempt.deadline);
    *mine = Annotate(copied, absl::StrCat("replica of rank ", shard, "'s data file"));
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
  // Every rank needs rank 0's commit time; on local roots it also needs the files. On
  // a shared root the rest of the message (the index may be megabytes) stays on rank 0.
  internal::StepFiles sent;
  if (options_.storage == Storage::kLocal) {
    sent = files;
  } else {
    sent.set_failure(files.failure());
    sent.set_commit_seconds(files.commit_seconds());
  }
  ASSIGN_OR_RETURN(std::string bytes, collective_->Broadcast(sent.SerializeAsString(), 0, attempt.deadline));
  if (!sent.ParseFromString(bytes)) return absl::InternalError("rank 0 sent an unparsable index");
  attempt.commit_seconds = sent.commit_seconds();
  if (options_.storage == Storage::kLocal) files = std::move(sent);
  // Without rank 0's files there is nothing to write; its own vote says why.
  if (Publishes() && files.failure().empty()) *mine = WriteStepFiles(attempt.key, files);
  return absl::OkStatus();
}

absl::Status Coordinator::PublishPhase(Attempt& attempt, absl::Status* mine) {
  *mine = Publish(attempt.key);
  attempt.published_here = mine->ok();
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
  // A committed step took what rank 0 measured (see StepFiles.commit_seconds); a failed
  // one as long as it ran here.
  const absl::Duration took =
      agreed.ok() ? absl::Seconds(attempt.commit_seconds) : absl::Now() - attempt.started;
  if (agreed.ok()) {
    LogEvent(spdlog::level::info,
             {.run = key.run, .step = key.step, .bytes = attempt.bytes, .seconds = attempt.commit_seconds},
             "run '{}' step {} committed in {} ({} bytes written here)", key.run, key.step,
             FormatSeconds(attempt.commit_seconds), attempt.bytes);
  }
  NotifyConcluded({.key = key,
                   .status = agreed,
                   .bytes_written = agreed.ok() ? attempt.bytes : 0,
                   .took = took,
                   .data_file = agreed.ok()
                                    ? DataPath(CheckpointStore::Prefix(store_->StepDir(key.run, key.step)),
                                               collective_->rank(), collective_->size())
                                    : ""});
  // After the observers: retention may remove steps they keep (OnRemoved follows).
  if (Publishes()) ConcludePublished(key, agreed);
  if (!agreed.ok()) {
    LogEvent(spdlog::level::err, {.run = key.run, .step = key.step, .seconds = absl::ToDoubleSeconds(took)},
             "run '{}' step {} failed: {}", key.run, key.step, std::string(agreed.message()));
  }
  registry_->FinishStep(key, agreed, agreed.ok() ? attempt.bytes : 0, took, Everyone(attempt.trainer_count));
}

void Coordinator::ConcludePublished(const StepKey& key, const absl::Status& agreed) {
  if (!agreed.ok()) {  // nothing of it stays: its temp directory goes
    const std::string temp_dir = store_->TempDir(key.run, key.step);
    if (absl::Status s = store_->fs()->DeleteRecursively(temp_dir); !s.ok()) {
      spdlog::error("removing {}: {}", temp_dir, std::string(s.message()));
    }
    return;
  }
  ApplyRetention(key);
  if (absl::Status s = store_->ClearLost(key.run, key.step); !s.ok()) {
    spdlog::warn("run '{}' step {}: {}", key.run, key.step, std::string(s.message()));
  }
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
  for (const RoundParticipant* participant : participants_) participant->Protect(key.run, &protect);
  auto removed = store_->ApplyRetention(key.run, options_.keep_last, options_.keep_every_n_steps, protect,
                                        /*dry_run=*/false);
  if (!removed.ok()) {
    spdlog::warn("run '{}': retention: {}", key.run, std::string(removed.status().message()));
  } else if (!removed->empty()) {
    spdlog::info("run '{}': retention removed step(s) {}", key.run, absl::StrJoin(*removed, ","));
    for (CommitObserver* observer : observers_) observer->OnRemoved(key.run, *removed);
  }
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
