#include "daemon/coord/coordinator.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckptd/v1/wire.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/bundle/checkpoint_meta.h"
#include "daemon/bundle/crc32c.h"
#include "daemon/layout/mesh.h"

namespace ckptd {
namespace {

internal::Vote ToVote(const absl::Status& s) {
  internal::Vote v;
  v.set_code(static_cast<int>(s.code()));
  v.set_message(std::string(s.message()));
  return v;
}

absl::Status FromVote(const internal::Vote& v) {
  return absl::Status(static_cast<absl::StatusCode>(v.code()), v.message());
}

// Trainer ids 0..count-1: every trainer of a step learns its outcome.
std::set<int> Everyone(int count) {
  std::set<int> ids;
  for (int t = 0; t < count; ++t) ids.insert(t);
  return ids;
}

Box BoxOf(const google::protobuf::RepeatedField<int64_t>& start,
          const google::protobuf::RepeatedField<int64_t>& length) {
  return Box{{start.begin(), start.end()}, {length.begin(), length.end()}};
}

}  // namespace

absl::Status Coordinator::Run(const std::atomic<bool>& stop) {
  spdlog::info("coordinator: {} rank(s), commit timeout {}", collective_->size(),
               absl::FormatDuration(options_.commit_timeout));
  // A collective past its deadline fails what it was doing here at once (trainers
  // hear DEADLINE_EXCEEDED) while the coordinator keeps waiting for the late rank, so
  // that every rank still takes the same path through the protocol.
  collective_->SetExpiryHandler([this](const absl::Status& late) { OnExpiry(late); });
  collective_->SetStopCheck([&stop] { return stop.load(); }, options_.stop_grace);
  absl::Duration idle_nap = absl::Microseconds(500);
  while (true) {
    bool stopping = false;
    absl::StatusOr<bool> worked = Round(stop.load(), &stopping);
    if (!worked.ok() && stop.load()) {
      // Asked to stop while a peer is gone (the wait for it gave up, or MPI reported
      // the broken link): stop here alone.
      const absl::Status alone = absl::UnavailableError(
          absl::StrCat("ckptd is shutting down; step not committed (", worked.status().message(), ")"));
      registry_->FailEverything(alone);
      spdlog::warn("coordinator: stopping without the other ranks: {}",
                   std::string(worked.status().message()));
      return alone;
    }
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

void Coordinator::OnExpiry(const absl::Status& late) {
  spdlog::error("{}", std::string(late.message()));
  if (phase_.idle) {
    // Stuck in a round that began with nothing to do: fail whatever was staged here
    // since, rather than let it wait for a rank that is not coming.
    internal::RoundState now = registry_->Snapshot();
    for (const auto& p : now.steps()) phase_.steps.push_back({p.run(), p.step()});
    for (const auto& b : now.barriers()) phase_.barriers.emplace_back(b.run(), b.barrier_id());
  }
  if (phase_.final_outcome) {
    // Past the last vote the outcome is rank 0's to announce; wait for it rather than
    // tell trainers something that may turn out false.
    return;
  }
  for (const StepKey& key : phase_.steps) {
    absl::Status failed = absl::DeadlineExceededError(
        absl::StrCat("run '", key.run, "' step ", key.step, " not committed within ",
                     absl::FormatDuration(options_.commit_timeout), ": ", late.message()));
    failed_here_.emplace(key, failed);
    registry_->FinishStep(key, failed, 0);
  }
  for (const auto& [run, id] : phase_.barriers) {
    registry_->FinishBarrier(
        run, id,
        absl::DeadlineExceededError(absl::StrCat("barrier ", id, " of run '", run, "': ", late.message())));
  }
  phase_ = Phase{};
  phase_.idle = true;  // later expiries of this operation look for new work again
}

absl::StatusOr<bool> Coordinator::Round(bool stop_requested, bool* stopping) {
  internal::RoundState mine = registry_->Snapshot();
  mine.set_stopping(stop_requested);
  const absl::Time now = absl::Now();
  if (options_.local_report && now - report_time_ > absl::Milliseconds(200)) {
    report_ = options_.local_report();
    report_time_ = now;
  }
  mine.set_report(report_);
  for (const auto& [key, since] : first_seen_) {
    if (now - since > options_.commit_timeout) {
      internal::StepRef* e = mine.add_expired();
      e->set_run(key.run);
      e->set_step(key.step);
    }
  }
  for (const auto& [key, since] : barrier_first_seen_) {
    if (now - since > options_.commit_timeout) {
      internal::BarrierRef* e = mine.add_expired_barriers();
      e->set_run(key.first);
      e->set_barrier_id(key.second);
    }
  }
  std::vector<std::string> all;
  {
    Phase exchange{.idle = mine.steps_size() == 0 && mine.barriers_size() == 0};
    for (const auto& p : mine.steps()) exchange.steps.push_back({p.run(), p.step()});
    for (const auto& b : mine.barriers()) exchange.barriers.emplace_back(b.run(), b.barrier_id());
    PhaseScope scope(&phase_, std::move(exchange));
    // Even an idle round has a deadline: work staged while a peer is stuck must fail
    // in time (see OnExpiry).
    ASSIGN_OR_RETURN(all, collective_->AllGather(mine.SerializeAsString(), now + options_.commit_timeout));
  }

  struct Tally {
    std::set<int> counts;
    int staged = 0;
    int64_t mesh_size = 0;
    std::set<int> trainers;
    std::set<int> told;           // steps: trainers that know of `failure`
    std::map<int, int> arrivals;  // barriers: arrivals per trainer id
    std::string failure;
    bool expired = false;
  };
  std::map<StepKey, Tally> steps;
  std::map<std::pair<std::string, int64_t>, Tally> barriers;
  restoring_.clear();
  std::vector<std::string> reports;
  for (const std::string& bytes : all) {
    internal::RoundState state;
    if (!state.ParseFromString(bytes)) return absl::InternalError("a rank sent an unparsable round state");
    reports.push_back(state.report());
    if (state.stopping()) *stopping = true;
    for (const auto& p : state.steps()) {
      Tally& t = steps[{p.run(), p.step()}];
      if (p.trainer_count() > 0) t.counts.insert(p.trainer_count());
      t.staged += p.staged();
      t.trainers.insert(p.trainers().begin(), p.trainers().end());
      t.told.insert(p.told().begin(), p.told().end());
      if (!p.failure().empty() && t.failure.empty()) t.failure = p.failure();
    }
    for (const auto& e : state.expired()) steps[{e.run(), e.step()}].expired = true;
    for (const auto& r : state.restoring()) restoring_.insert({r.run(), r.step()});
    for (const auto& b : state.barriers()) {
      Tally& t = barriers[{b.run(), b.barrier_id()}];
      t.counts.insert(b.trainer_counts().begin(), b.trainer_counts().end());
      if (b.trainer_counts().empty()) t.counts.insert(b.trainer_count());
      t.staged += b.arrived();
      for (int id : b.trainer_ids()) ++t.arrivals[id];
      t.mesh_size = std::max(t.mesh_size, b.mesh_size());
    }
    for (const auto& e : state.expired_barriers()) barriers[{e.run(), e.barrier_id()}].expired = true;
  }
  registry_->SetRankReports(std::move(reports), now);
  if (*stopping) return true;

  bool worked = false;
  auto fail = [&](const StepKey& key, const Tally& tally, const absl::Status& status) {
    worked = true;
    first_seen_.erase(key);
    failed_here_.erase(key);
    registry_->TakeForCommit(key);
    std::set<int> participants = tally.trainers;
    participants.insert(tally.told.begin(), tally.told.end());
    registry_->FinishStep(key, status, 0, absl::ZeroDuration(), participants);
    spdlog::warn("{}", std::string(status.message()));
  };
  // Every rank iterates the same sorted maps, so all make the same decisions in order.
  for (const auto& [key, tally] : steps) {
    const std::string what = absl::StrCat("run '", key.run, "' step ", key.step);
    const int count = tally.counts.empty() ? 0 : *tally.counts.rbegin();
    if (!tally.failure.empty()) {
      fail(key, tally, absl::AbortedError(absl::StrCat(what, " failed: ", tally.failure)));
    } else if (tally.counts.size() > 1) {
      fail(key, tally,
           absl::InvalidArgumentError(
               absl::StrCat(what, ": trainers disagree on trainer_count across hosts")));
    } else if (tally.staged > count) {
      fail(key, tally,
           absl::InvalidArgumentError(absl::StrCat(what, ": ", tally.staged,
                                                   " trainers staged but trainer_count is ", count,
                                                   " (a trainer id is used twice)")));
    } else if (tally.staged == count && count > 0) {
      worked = true;
      first_seen_.erase(key);
      RETURN_IF_ERROR(CommitStep(key, count));
    } else if (tally.expired) {
      std::vector<int> missing;
      for (int t = 0; t < count; ++t) {
        if (tally.trainers.count(t) == 0) missing.push_back(t);
      }
      fail(
          key, tally,
          absl::DeadlineExceededError(absl::StrCat(
              what, ": only ", tally.staged, " of ", count, " trainers staged within ",
              absl::FormatDuration(options_.commit_timeout), "; missing trainer(s) ", JoinBounded(missing))));
    } else {
      first_seen_.try_emplace(key, now);
    }
  }
  // Forget steps no rank reports any more (failed elsewhere, or given up).
  for (auto it = first_seen_.begin(); it != first_seen_.end();) {
    it = steps.count(it->first) == 0 ? first_seen_.erase(it) : std::next(it);
  }
  for (const auto& [key, tally] : barriers) {
    const std::string what = absl::StrCat("barrier ", key.second, " of run '", key.first, "'");
    const int count = tally.counts.empty() ? 0 : *tally.counts.rbegin();
    std::vector<int> repeated, missing;
    for (const auto& [id, n] : tally.arrivals) {
      if (n > 1) repeated.push_back(id);
    }
    for (int t = 0; t < count; ++t) {
      if (tally.arrivals.count(t) == 0) missing.push_back(t);
    }
    // Each trainer id 0..count-1 must arrive exactly once; anything else fails every
    // trainer waiting in the barrier at once, on every host.
    absl::Status failed = absl::OkStatus();
    if (tally.counts.size() > 1) {
      failed = absl::InvalidArgumentError(absl::StrCat(what, ": trainers disagree on trainer_count (",
                                                       absl::StrJoin(tally.counts, " vs "), ")"));
    } else if (!repeated.empty()) {
      failed = absl::InvalidArgumentError(
          absl::StrCat(what, ": trainer id(s) ", JoinBounded(repeated), " arrived more than once"));
    } else if (missing.empty()) {
      worked = true;
      barrier_first_seen_.erase(key);
      RETURN_IF_ERROR(CompleteBarrier(key, tally.mesh_size, mine));
      continue;
    } else if (tally.expired) {
      failed = absl::DeadlineExceededError(absl::StrCat(
          what, ": ", count - static_cast<int>(missing.size()), " of ", count, " trainers arrived within ",
          absl::FormatDuration(options_.commit_timeout), "; missing trainer(s) ", JoinBounded(missing)));
    } else {
      barrier_first_seen_.try_emplace(key, now);
      continue;
    }
    worked = true;
    barrier_first_seen_.erase(key);
    spdlog::warn("{}", std::string(failed.message()));
    registry_->FinishBarrier(key.first, key.second, failed);
  }
  for (auto it = barrier_first_seen_.begin(); it != barrier_first_seen_.end();) {
    it = barriers.count(it->first) == 0 ? barrier_first_seen_.erase(it) : std::next(it);
  }
  return worked;
}

absl::Status Coordinator::CompleteBarrier(const std::pair<std::string, int64_t>& key, int64_t mesh_size,
                                          const internal::RoundState& mine) {
  const absl::Time barrier_deadline = absl::Now() + options_.commit_timeout;
  // As DTensor's barrier does: the devices declared on all hosts must make up the mesh.
  int64_t local_devices = 0;
  for (const auto& b : mine.barriers()) {
    if (b.run() == key.first && b.barrier_id() == key.second) local_devices = b.devices();
  }
  int64_t devices = 0;
  {
    PhaseScope scope(&phase_, Phase{.barriers = {key}});
    ASSIGN_OR_RETURN(devices, collective_->AllReduceSum(local_devices, barrier_deadline));
    RETURN_IF_ERROR(collective_->Barrier(barrier_deadline));
  }
  absl::Status outcome = absl::OkStatus();
  if (mesh_size > 0 && devices != mesh_size) {
    outcome = absl::FailedPreconditionError(absl::StrCat("barrier ", key.second, " of run '", key.first,
                                                         "': trainers on all hosts declared ", devices,
                                                         " devices but the mesh has ", mesh_size));
  }
  registry_->FinishBarrier(key.first, key.second, outcome);
  return absl::OkStatus();
}

absl::StatusOr<absl::Status> Coordinator::Vote(const absl::Status& mine, absl::Time deadline) {
  const int size = collective_->size();
  ASSIGN_OR_RETURN(int first_failed,
                   collective_->AllReduceMin(mine.ok() ? size : collective_->rank(), deadline));
  if (first_failed == size) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string vote,
                   collective_->Broadcast(ToVote(mine).SerializeAsString(), first_failed, deadline));
  internal::Vote parsed;
  parsed.ParseFromString(vote);
  return FromVote(parsed);
}

absl::Status Coordinator::Where(const absl::Status& s) const {
  if (s.ok()) return s;
  return Annotate(s, absl::StrCat("on rank ", collective_->rank(), " (host ", HostName(), ")"));
}

absl::Status Coordinator::LocalStatus(const StepKey& key, const absl::Status& s) const {
  auto it = failed_here_.find(key);
  return it != failed_here_.end() ? it->second : s;
}

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
  };
  for (const Step& step : {Step{&Coordinator::PreparePhase, true}, Step{&Coordinator::WritePhase, true},
                           Step{&Coordinator::MergePhase, true}, Step{&Coordinator::PublishPhase, false},
                           Step{&Coordinator::ConfirmPhase, false}}) {
    if (!step.deadline_may_fail_it) phase_.final_outcome = true;
    absl::Status mine;
    RETURN_IF_ERROR((this->*step.run)(attempt, &mine));
    if (step.deadline_may_fail_it) mine = LocalStatus(key, mine);
    ASSIGN_OR_RETURN(attempt.agreed, Vote(Where(mine), attempt.deadline));
    if (!attempt.agreed.ok()) {
      if (step.run == &Coordinator::ConfirmPhase && collective_->rank() == 0) Withdraw(key);
      break;
    }
  }
  Conclude(attempt);
  return absl::OkStatus();
}

absl::Status Coordinator::PlanPhase(Attempt& attempt, absl::StatusOr<SavePlan>* plan_out) {
  // Every rank learns every shard, then computes the same plan.
  internal::ShardList local;
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
  std::vector<ShardRef> shards;
  std::vector<TrainerDevices> trainers;
  absl::Status failed_somewhere = absl::OkStatus();
  for (int host = 0; host < static_cast<int>(all.size()); ++host) {
    internal::ShardList list;
    list.ParseFromString(all[host]);
    if (!list.failure().empty() && failed_somewhere.ok()) {
      failed_somewhere = absl::DeadlineExceededError(list.failure());
    }
    for (const internal::Shard& s : list.shards()) {
      shards.push_back({.name = s.name(),
                        .dtype = s.dtype(),
                        .shape = Shape(s.shape().begin(), s.shape().end()),
                        .box = BoxOf(s.start(), s.length()),
                        .host = host,
                        .trainer = s.trainer(),
                        .bytes = s.bytes(),
                        .has_layout = s.has_layout(),
                        .sharding_specs = {s.sharding_specs().begin(), s.sharding_specs().end()}});
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
  // Rank 0 clears leftovers (this step's earlier attempt, and the first time it sees a
  // run, temp directories orphaned by a crash) and creates the temp directory.
  if (collective_->rank() == 0) *mine = PrepareTempDir(attempt.key);
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
  const std::string temp_dir = store_->TempDir(key.run, key.step);
  RETURN_IF_ERROR(store_->fs()->DeleteRecursively(temp_dir));
  return store_->fs()->CreateDirs(temp_dir, options_.dir_mode);
}

absl::Status Coordinator::WritePhase(Attempt& attempt, absl::Status* mine) {
  *mine = WriteLocalShard(attempt.key, attempt.plan, attempt.payloads, &attempt.entries, &attempt.bytes);
  attempt.payloads.clear();  // staged memory goes back as soon as the bytes are on disk
  return absl::OkStatus();
}

absl::Status Coordinator::MergePhase(Attempt& attempt, absl::Status* mine) {
  // Rank 0 writes the index and ckptd.json into the temp directory; all vote once
  // more before anything becomes visible.
  ASSIGN_OR_RETURN(std::vector<std::string> gathered,
                   collective_->Gather(attempt.entries, 0, attempt.deadline));
  if (collective_->rank() == 0) {
    *mine = WriteIndex(attempt.key, attempt.trainer_count, attempt.plan, gathered, attempt.started);
  }
  return absl::OkStatus();
}

absl::Status Coordinator::PublishPhase(Attempt& attempt, absl::Status* mine) {
  if (collective_->rank() == 0) *mine = Publish(attempt.key);
  return absl::OkStatus();
}

absl::Status Coordinator::ConfirmPhase(Attempt& attempt, absl::Status* mine) {
  // Every rank checks that it sees the published step, its own bytes included; only
  // this vote lets Wait report the step committed.
  *mine = CheckPublishedHere(attempt.key, attempt.bytes);
  return absl::OkStatus();
}

void Coordinator::Conclude(const Attempt& attempt) {
  const StepKey& key = attempt.key;
  const absl::Status& agreed = attempt.agreed;
  failed_here_.erase(key);
  if (!agreed.ok() && collective_->rank() == 0) {
    const std::string temp_dir = store_->TempDir(key.run, key.step);
    if (absl::Status s = store_->fs()->DeleteRecursively(temp_dir); !s.ok()) {
      spdlog::error("removing {}: {}", temp_dir, std::string(s.message()));
    }
  }
  if (agreed.ok()) {
    spdlog::info("run '{}' step {} committed in {} ({} bytes written here)", key.run, key.step,
                 absl::FormatDuration(absl::Now() - attempt.started), attempt.bytes);
    if (collective_->rank() == 0) ApplyRetention(key);
  } else {
    spdlog::warn("run '{}' step {} failed: {}", key.run, key.step, std::string(agreed.message()));
  }
  registry_->FinishStep(key, agreed, agreed.ok() ? attempt.bytes : 0, absl::Now() - attempt.started,
                        Everyone(attempt.trainer_count));
}

absl::Status Coordinator::CheckPublishedHere(const StepKey& key, int64_t bytes_written) {
  const std::string step_dir = store_->StepDir(key.run, key.step);
  const std::string prefix = CheckpointStore::Prefix(step_dir);
  FileSystem* fs = store_->fs();
  ASSIGN_OR_RETURN(bool visible, store_->Committed(key.run, key.step));
  if (!visible) {
    return absl::FailedPreconditionError(absl::StrCat("published ", step_dir, " is not visible here (no ",
                                                      IndexPath(prefix),
                                                      "): every daemon must see the same root"));
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

void Coordinator::Withdraw(const StepKey& key) {
  spdlog::error("run '{}' step {}: withdrawing {}: not every rank sees it", key.run, key.step,
                store_->StepDir(key.run, key.step));
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

absl::Status Coordinator::CheckSharedRoot() {
  const absl::Time deadline = absl::Now() + options_.commit_timeout;
  const int rank = collective_->rank();
  FileSystem* fs = store_->fs();
  const std::string path = JoinPath(store_->root(), ".ckptd-root-check");
  std::string token;
  absl::Status written = absl::OkStatus();
  if (rank == 0) {
    token = absl::StrCat(HostName(), ":", ::getpid(), ":", absl::ToUnixNanos(absl::Now()));
    written = fs->WriteFileAtomically(path, token);
  }
  ASSIGN_OR_RETURN(absl::Status agreed, Vote(Where(written), deadline));
  RETURN_IF_ERROR(agreed);
  ASSIGN_OR_RETURN(token, collective_->Broadcast(token, 0, deadline));
  absl::StatusOr<std::string> seen = fs->ReadFileToString(path, 4096);
  absl::Status mine = absl::OkStatus();
  if (!seen.ok() || *seen != token) {
    mine = absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " on host ", HostName(), " does not see the checkpoint root ", store_->root(),
        " that rank 0 wrote to (", seen.ok() ? "another daemon's token is there" : seen.status().message(),
        "): every daemon must use one shared root (a parallel or network file system mounted at the same "
        "path on "
        "every host); point root at such a directory"));
  }
  ASSIGN_OR_RETURN(agreed, Vote(mine, deadline));
  if (rank == 0) fs->DeleteFile(path).IgnoreError();
  return agreed;
}

void Coordinator::ApplyRetention(const StepKey& key) {
  if (options_.keep_last <= 0 && options_.keep_every_n_steps <= 0) return;
  std::set<int64_t> protect;
  for (const StepKey& r : restoring_) {
    if (r.run == key.run) protect.insert(r.step);
  }
  auto removed = store_->ApplyRetention(key.run, options_.keep_last, options_.keep_every_n_steps, protect,
                                        /*dry_run=*/false);
  if (!removed.ok()) {
    spdlog::warn("run '{}': retention: {}", key.run, std::string(removed.status().message()));
  } else if (!removed->empty()) {
    spdlog::info("run '{}': retention removed step(s) {}", key.run, absl::StrJoin(*removed, ","));
  }
}

absl::Status Coordinator::WriteLocalShard(const StepKey& key, const SavePlan& plan,
                                          std::vector<TrainerPayload>& payloads, std::string* entries_out,
                                          int64_t* bytes_out) {
  const absl::Time started = absl::Now();
  const int rank = collective_->rank();
  // What this rank writes, in plan order; every other staged box (written by another
  // host, or a second local replica) goes back to staging memory now.
  struct Job {
    const PlannedTensor* tensor;
    const PlannedBox* box;
    StagedTensor* staged;
    int64_t offset = 0;
    uint32_t crc = 0;
    absl::Status checksummed;
    std::atomic<int> left{2};  // the write and the checksum; the last one frees the bytes
  };
  std::map<std::pair<std::string, Box>, StagedTensor*> staged;
  for (TrainerPayload& p : payloads) {
    for (StagedTensor& t : p.tensors) staged.emplace(std::make_pair(t.name, t.box), &t);
  }
  std::deque<Job> jobs;
  std::set<const StagedTensor*> used;
  for (const PlannedTensor& t : plan.tensors) {
    for (const PlannedBox& b : t.boxes) {
      if (b.writer != rank) continue;
      auto it = staged.find({t.name, b.box});
      if (it == staged.end()) {
        return absl::InternalError(absl::StrCat("plan assigned box ", b.box.ToString(), " of '", t.name,
                                                "' to rank ", rank, ", which does not hold it"));
      }
      jobs.emplace_back();
      jobs.back().tensor = &t;
      jobs.back().box = &b;
      jobs.back().staged = it->second;
      used.insert(it->second);
    }
  }
  for (TrainerPayload& p : payloads) {
    for (StagedTensor& t : p.tensors) {
      if (used.count(&t) == 0) t.bytes = StagedBuffer();
    }
  }
  auto finish = [](Job& j) {
    if (j.left.fetch_sub(1) == 1) j.staged->bytes = StagedBuffer();
  };
  // Checksums run on other threads while this one writes.
  std::atomic<size_t> next_checksum{0};
  auto checksum = [&] {
    for (size_t i = next_checksum++; i < jobs.size(); i = next_checksum++) {
      Job& j = jobs[i];
      const StagedBuffer& bytes = j.staged->bytes;
      absl::StatusOr<uint32_t> crc = EntryChecksum(j.tensor->dtype, j.box->box.NumElements(), bytes.data(),
                                                   static_cast<size_t>(bytes.size()));
      j.checksummed = crc.status();
      if (crc.ok()) j.crc = *crc;
      finish(j);
    }
  };
  std::vector<std::thread> checksummers;
  for (int i = 0; i < std::max(1, options_.checksum_threads); ++i) checksummers.emplace_back(checksum);
  int64_t file_bytes = 0;
  absl::Status written = [&]() -> absl::Status {
    const std::string path =
        DataPath(CheckpointStore::Prefix(store_->TempDir(key.run, key.step)), rank, collective_->size());
    ASSIGN_OR_RETURN(std::unique_ptr<DataFileWriter> file, DataFileWriter::Create(store_->fs(), path));
    for (Job& j : jobs) {
      const StagedBuffer& bytes = j.staged->bytes;
      ASSIGN_OR_RETURN(j.offset, file->AppendUnchecked(
                                     absl::string_view(bytes.data(), static_cast<size_t>(bytes.size()))));
      finish(j);
    }
    file_bytes = file->size();
    return file->Finish();
  }();
  // A failed write leaves its remaining jobs unfinished here: the checksummers still
  // finish theirs, and the payloads free whatever is left when they go.
  for (std::thread& t : checksummers) t.join();
  RETURN_IF_ERROR(written);

  internal::WrittenEntries entries;
  for (const Job& j : jobs) {
    RETURN_IF_ERROR(j.checksummed);
    internal::WrittenEntry* e = entries.add_entries();
    e->set_name(j.tensor->name);
    e->set_dtype(j.tensor->dtype);
    e->mutable_shape()->Add(j.tensor->shape.begin(), j.tensor->shape.end());
    e->mutable_start()->Add(j.box->box.start.begin(), j.box->box.start.end());
    e->mutable_length()->Add(j.box->box.length.begin(), j.box->box.length.end());
    e->set_shard(rank);
    e->set_offset(j.offset);
    e->set_size(j.box->bytes);
    e->set_crc32c(j.crc);
  }
  entries.set_file_bytes(file_bytes);
  entries.set_write_seconds(absl::ToDoubleSeconds(absl::Now() - started));
  *entries_out = entries.SerializeAsString();
  *bytes_out = file_bytes;
  return absl::OkStatus();
}

absl::Status Coordinator::WriteIndex(const StepKey& key, int trainer_count, const SavePlan& plan,
                                     const std::vector<std::string>& gathered, absl::Time started) {
  const int num_shards = collective_->size();
  const std::string temp_dir = store_->TempDir(key.run, key.step);
  const std::string prefix = CheckpointStore::Prefix(temp_dir);

  // (name, box) -> where its bytes landed.
  std::map<std::pair<std::string, Box>, internal::WrittenEntry> located;
  CheckpointMeta meta{.version = options_.version,
                      .run = key.run,
                      .step = key.step,
                      .num_hosts = num_shards,
                      .trainer_count = trainer_count,
                      .mesh = plan.mesh,
                      .bytes_per_host = plan.bytes_per_host};
  for (int host = 0; host < static_cast<int>(gathered.size()); ++host) {
    internal::WrittenEntries list;
    if (!list.ParseFromString(gathered[host])) {
      return absl::InternalError(absl::StrCat("rank ", host, " sent unparsable index entries"));
    }
    for (const internal::WrittenEntry& e : list.entries()) {
      located[{e.name(), BoxOf(e.start(), e.length())}] = e;
    }
    meta.hosts.push_back({.rank = host,
                          .file = DataPath("ckpt", host, num_shards),
                          .bytes = list.file_bytes(),
                          .write_seconds = list.write_seconds()});
    meta.max_write_seconds = std::max(meta.max_write_seconds, list.write_seconds());
  }

  IndexBuilder index(num_shards);
  for (const PlannedTensor& t : plan.tensors) {
    CheckpointMeta::Tensor tensor{.name = t.name, .dtype = DataTypeName(t.dtype), .shape = t.shape};
    for (const PlannedBox& b : t.boxes) tensor.boxes.push_back({.box = b.box, .writer = b.writer});
    if (t.has_layout && !plan.mesh.empty()) {
      auto mesh = ParseMesh(plan.mesh);
      if (mesh.ok()) tensor.layout = Layout{t.sharding_specs, *mesh}.ToString();
    }
    meta.tensors.push_back(std::move(tensor));

    std::vector<std::pair<Box, tf::BundleEntryProto>> pieces;
    for (const PlannedBox& b : t.boxes) {
      auto it = located.find({t.name, b.box});
      if (it == located.end()) {
        return absl::InternalError(
            absl::StrCat("no host reported writing box ", b.box.ToString(), " of '", t.name, "'"));
      }
      tf::BundleEntryProto e;
      e.set_shard_id(it->second.shard());
      e.set_offset(it->second.offset());
      e.set_size(it->second.size());
      e.set_crc32c(it->second.crc32c());
      pieces.emplace_back(b.box, std::move(e));
    }
    RETURN_IF_ERROR(index.AddTensor(t.name, t.dtype, t.shape, std::move(pieces)));
  }
  ASSIGN_OR_RETURN(std::string index_bytes, index.Finish());

  meta.created_unix = absl::ToUnixSeconds(absl::Now());
  meta.commit_seconds = absl::ToDoubleSeconds(absl::Now() - started);
  FileSystem* fs = store_->fs();
  for (const auto& [path, contents] :
       {std::make_pair(IndexPath(prefix), index_bytes),
        std::make_pair(JoinPath(temp_dir, kCheckpointMetaFile), meta.ToJson())}) {
    ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs->NewWritableFile(path));
    RETURN_IF_ERROR(file->Append(contents));
    RETURN_IF_ERROR(file->Sync());
    RETURN_IF_ERROR(file->Close());
  }
  return fs->SyncDir(temp_dir);
}

absl::Status Coordinator::Publish(const StepKey& key) {
  // One rename makes the step visible; the directory sync makes that durable, and
  // only then does TF's state file name it.
  FileSystem* fs = store_->fs();
  const std::string temp_dir = store_->TempDir(key.run, key.step);
  const std::string step_dir = store_->StepDir(key.run, key.step);
  RETURN_IF_ERROR(fs->Rename(temp_dir, step_dir));
  absl::Status s = fs->SyncDir(store_->RunDir(key.run));
  if (s.ok()) s = store_->WriteStateFile(key.run);
  if (s.ok()) return s;
  // Not durably published: take it back so that nothing reports a failed step.
  spdlog::error("run '{}' step {}: publish failed ({}); withdrawing it", key.run, key.step,
                std::string(s.message()));
  TakeBack(key);
  return s;
}

}  // namespace ckptd
