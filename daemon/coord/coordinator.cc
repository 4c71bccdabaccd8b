#include "daemon/coord/coordinator.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
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

// Status lists at most this many missing trainers of a gathering step (and counts them all).
constexpr size_t kMaxMissingShown = 64;

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
}  // namespace

Coordinator::Coordinator(Collective* collective, StepRegistry* registry, CheckpointStore* store,
                         CoordinatorOptions options)
    : collective_(collective), registry_(registry), store_(store), options_(std::move(options)) {
  if (options_.drainer != nullptr) {
    AddParticipant(&drain_.emplace(DrainScheduleOptions{.rank = collective->rank(),
                                                        .num_ranks = collective->size(),
                                                        .source = store,
                                                        .drain = options_.drain_store,
                                                        .drainer = options_.drainer,
                                                        .every_n_steps = options_.drain_every_n_steps,
                                                        .keep_last = options_.drain_keep_last}));
  }
}

absl::Status Coordinator::Run(const std::atomic<bool>& stop) {
  spdlog::info("coordinator: {} rank(s), commit timeout {}", collective_->size(),
               absl::FormatDuration(options_.commit_timeout));
  // A collective past its deadline fails what it was doing here at once (trainers
  // hear DEADLINE_EXCEEDED) while the coordinator keeps waiting for the late rank, so
  // that every rank still takes the same path through the protocol.
  collective_->SetExpiryHandler([this](const absl::Status& late) { OnExpiry(late); });
  collective_->SetStopCheck([&stop] { return stop.load(); }, options_.stop_grace);
  for (RoundParticipant* participant : participants_) participant->OnStart();
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

// Every rank's RoundState summed up. Every rank builds the same tally from the same
// gathered states, so all make the same decisions in the same order.
struct Coordinator::RoundTally {
  struct Entry {
    std::set<int> counts;
    int staged = 0;
    int64_t mesh_size = 0;
    std::set<int> trainers;
    std::set<int> told;           // steps: trainers that know of `failure`
    std::map<int, int> arrivals;  // barriers: arrivals per trainer id
    std::string failure;
    bool expired = false;
  };
  std::map<StepKey, Entry> steps;
  std::map<std::pair<std::string, int64_t>, Entry> barriers;
  std::set<StepKey> restoring;
  std::vector<std::string> reports;  // every rank's status report, by rank
  bool stopping = false;
  std::vector<internal::RoundState> states{};  // every rank's, by rank (for the participants)
};

internal::RoundState Coordinator::LocalRoundState(bool stop_requested, absl::Time now) {
  internal::RoundState mine = registry_->Snapshot();
  mine.set_stopping(stop_requested);
  if (options_.local_report && now - report_time_ > absl::Milliseconds(200)) {
    report_ = options_.local_report();
    report_time_ = now;
  }
  mine.set_report(report_);
  for (RoundParticipant* participant : participants_) participant->AddToRound(&mine);
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
  return mine;
}

absl::StatusOr<Coordinator::RoundTally> Coordinator::Tally(const std::vector<std::string>& all) {
  RoundTally tally;
  for (const std::string& bytes : all) {
    internal::RoundState state;
    if (!state.ParseFromString(bytes)) return absl::InternalError("a rank sent an unparsable round state");
    tally.reports.push_back(state.report());
    tally.stopping |= state.stopping();
    for (const auto& p : state.steps()) {
      RoundTally::Entry& t = tally.steps[{p.run(), p.step()}];
      if (p.trainer_count() > 0) t.counts.insert(p.trainer_count());
      t.staged += p.staged();
      t.trainers.insert(p.trainers().begin(), p.trainers().end());
      t.told.insert(p.told().begin(), p.told().end());
      if (!p.failure().empty() && t.failure.empty()) t.failure = p.failure();
    }
    for (const auto& e : state.expired()) tally.steps[{e.run(), e.step()}].expired = true;
    for (const auto& r : state.restoring()) tally.restoring.insert({r.run(), r.step()});
    for (const auto& b : state.barriers()) {
      RoundTally::Entry& t = tally.barriers[{b.run(), b.barrier_id()}];
      t.counts.insert(b.trainer_counts().begin(), b.trainer_counts().end());
      if (b.trainer_counts().empty()) t.counts.insert(b.trainer_count());
      t.staged += b.arrived();
      for (int id : b.trainer_ids()) ++t.arrivals[id];
      t.mesh_size = std::max(t.mesh_size, b.mesh_size());
    }
    for (const auto& e : state.expired_barriers()) tally.barriers[{e.run(), e.barrier_id()}].expired = true;
    tally.states.push_back(std::move(state));
  }
  return tally;
}

absl::StatusOr<bool> Coordinator::Round(bool stop_requested, bool* stopping) {
  const absl::Time now = absl::Now();
  const internal::RoundState mine = LocalRoundState(stop_requested, now);
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
  ASSIGN_OR_RETURN(RoundTally tally, Tally(all));
  restoring_ = std::move(tally.restoring);
  registry_->SetRankReports(std::move(tally.reports), now);
  if (tally.stopping) {
    *stopping = true;
    return true;
  }
  ASSIGN_OR_RETURN(const bool steps_worked, DecideSteps(tally, now));
  ASSIGN_OR_RETURN(const bool barriers_worked, DecideBarriers(tally, mine, now));
  bool participants_worked = false;
  for (RoundParticipant* participant : participants_) {
    participants_worked |= participant->OnRound(tally.states, restoring_);
  }
  return steps_worked || barriers_worked || participants_worked;
}

absl::StatusOr<bool> Coordinator::DecideSteps(const RoundTally& round, absl::Time now) {
  bool worked = false;
  std::vector<StepRegistry::GatheringStep> gathering;
  auto fail = [&](const StepKey& key, const RoundTally::Entry& tally, const absl::Status& status) {
    worked = true;
    first_seen_.erase(key);
    failed_here_.erase(key);
    registry_->TakeForCommit(key);
    std::set<int> participants = tally.trainers;
    participants.insert(tally.told.begin(), tally.told.end());
    registry_->FinishStep(key, status, 0, absl::ZeroDuration(), participants);
    NotifyConcluded({.key = key, .status = status});
    spdlog::warn("{}", std::string(status.message()));
  };
  for (const auto& [key, tally] : round.steps) {
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
      const absl::Time first_seen = first_seen_.try_emplace(key, now).first->second;
      StepRegistry::GatheringStep view{.key = key,
                                       .trainer_count = count,
                                       .trainers_staged = tally.staged,
                                       .deadline = first_seen + options_.commit_timeout};
      for (int t = 0; t < count && view.missing.size() < kMaxMissingShown; ++t) {
        if (tally.trainers.count(t) == 0) view.missing.push_back(t);
      }
      gathering.push_back(std::move(view));
    }
  }
  registry_->SetGathering(std::move(gathering));
  // Forget steps no rank reports any more (failed elsewhere, or given up).
  for (auto it = first_seen_.begin(); it != first_seen_.end();) {
    it = round.steps.count(it->first) == 0 ? first_seen_.erase(it) : std::next(it);
  }
  return worked;
}

absl::StatusOr<bool> Coordinator::DecideBarriers(const RoundTally& round, const internal::RoundState& mine,
                                                 absl::Time now) {
  bool worked = false;
  for (const auto& [key, tally] : round.barriers) {
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
    it = round.barriers.count(it->first) == 0 ? barrier_first_seen_.erase(it) : std::next(it);
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

absl::Status Coordinator::Where(const absl::Status& s) const { return OnRank(s, collective_->rank()); }

absl::Status Coordinator::LocalStatus(const StepKey& key, const absl::Status& s) const {
  auto it = failed_here_.find(key);
  return it != failed_here_.end() ? it->second : s;
}
absl::Status Coordinator::CheckRoot() {
  RETURN_IF_ERROR(CheckSharing(*store_, options_.storage, /*drain=*/false));
  if (options_.drain_store == nullptr) return absl::OkStatus();
  return CheckSharing(*options_.drain_store, Storage::kShared, /*drain=*/true);
}

absl::Status Coordinator::CheckSharing(const CheckpointStore& where, Storage expected, bool drain) {
  const absl::Time deadline = absl::Now() + options_.commit_timeout;
  const int rank = collective_->rank();
  FileSystem* fs = where.fs();
  constexpr char kTokenPrefix[] = ".ckptd-root-check-";
  auto token_path = [&](int r) { return JoinPath(where.root(), absl::StrCat(kTokenPrefix, r)); };
  const std::string token = absl::StrCat(HostName(), ":", ::getpid(), ":", absl::ToUnixNanos(absl::Now()));
  ASSIGN_OR_RETURN(absl::Status agreed,
                   Vote(Where(fs->WriteFileAtomically(token_path(rank), token)), deadline));
  RETURN_IF_ERROR(agreed);
  ASSIGN_OR_RETURN(std::vector<std::string> tokens, collective_->AllGather(token, deadline));
  // Which other ranks' tokens this rank sees in its root (a stale file left by an
  // earlier daemon holds another token and does not count).
  std::vector<int> seen;
  if (absl::StatusOr<std::vector<std::string>> names = fs->ListDir(where.root()); names.ok()) {
    for (const std::string& name : *names) {
      int r = -1;
      if (!absl::StartsWith(name, kTokenPrefix) || !absl::SimpleAtoi(name.substr(strlen(kTokenPrefix)), &r) ||
          r == rank || r < 0 || r >= static_cast<int>(tokens.size())) {
        continue;
      }
      if (fs->ReadFileToString(token_path(r), 4096).value_or("") == tokens[r]) seen.push_back(r);
    }
  }
  std::sort(seen.begin(), seen.end());
  absl::Status mine = absl::OkStatus();
  const std::string who = absl::StrCat("rank ", rank, " on host ", HostName());
  if (expected == Storage::kShared && seen.size() + 1 != tokens.size()) {
    // A token begins with its writer's host name, so the message can name both ends.
    std::vector<std::string> unseen;
    for (int r = 0; r < static_cast<int>(tokens.size()); ++r) {
      if (r != rank && !std::binary_search(seen.begin(), seen.end(), r)) {
        unseen.push_back(absl::StrCat(r, " (on ", tokens[r].substr(0, tokens[r].find(':')), ")"));
      }
    }
    mine = absl::FailedPreconditionError(
        drain ? absl::StrCat(who, " does not see the drain root ", where.root(), " that rank(s) ",
                             JoinBounded(unseen),
                             " wrote to: drain_to must be one directory that every host sees (a parallel or "
                             "network file system mounted at the same path on every host)")
              : absl::StrCat(
                    who, " does not see the checkpoint root ", where.root(), " that rank(s) ",
                    JoinBounded(unseen),
                    " wrote to: with storage: shared every daemon must use one shared root (a parallel "
                    "or network file system mounted at the same path on every host); point root at "
                    "such a directory, or use storage: local for node-local disks"));
  } else if (expected == Storage::kLocal && !seen.empty()) {
    mine = absl::FailedPreconditionError(absl::StrCat(
        who, " shares its checkpoint root ", where.root(), " with rank(s) ", JoinBounded(seen),
        ": with storage: local every daemon needs a root of its own (put {rank} in root when several "
        "daemons share a machine), or use storage: shared"));
  }
  ASSIGN_OR_RETURN(agreed, Vote(mine, deadline));
  fs->DeleteFile(token_path(rank)).IgnoreError();
  return agreed;
}

void Coordinator::SetReplicas(std::vector<std::vector<int>> copies, ShardCopier* copier) {
  replica_copies_ = std::move(copies);
  copier_ = copier;
}

void Coordinator::SetParity(ParityGroups groups, int parity, ShardCopier* copier) {
  parity_groups_ = std::move(groups);
  parity_ = parity;
  copier_ = copier;
}

absl::StatusOr<std::vector<internal::PeerInfo>> Coordinator::ExchangePeerInfo(
    const internal::PeerInfo& mine) {
  ASSIGN_OR_RETURN(std::vector<std::string> all,
                   collective_->AllGather(mine.SerializeAsString(), absl::Now() + options_.commit_timeout));
  std::vector<internal::PeerInfo> infos(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    if (!infos[r].ParseFromString(all[r])) return absl::InternalError("a rank sent unparsable peer info");
  }
  return infos;
}

absl::StatusOr<std::string> Coordinator::ShareFromRankZero(const std::string& value) {
  return collective_->Broadcast(value, 0, absl::Now() + options_.commit_timeout);
}

}  // namespace ckptd
