#include "daemon/coord/step_registry.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"

namespace ckptd {

absl::Status StepRegistry::AdmitLocked(const StepKey& key, int trainer, bool staging) {
  auto done = outcomes_.find(key);
  if (done != outcomes_.end()) {
    if (done->second.ok()) {
      return absl::AlreadyExistsError(
          absl::StrCat("run '", key.run, "' step ", key.step, " is already committed"));
    }
    std::set<int>& told = told_[key];
    if (told.count(trainer) > 0) {
      // This trainer knows the attempt failed: saving again is a retry, and the old
      // failure must not refuse the trainers that join it.
      outcomes_.erase(done);
      told_.erase(key);
      return absl::OkStatus();
    }
    told.insert(trainer);
    return absl::AbortedError(done->second.message());
  }
  auto pending = pending_.find(key);
  if (pending != pending_.end() && !pending->second.failure.ok()) {
    // Failed here but not yet agreed by every rank. A trainer that knows may start
    // sending its retry (the failure is usually agreed before its bytes are in), but
    // cannot stage into the failed attempt.
    std::set<int>& told = pending->second.told;
    if (!staging && told.count(trainer) > 0) return absl::OkStatus();
    told.insert(trainer);
    return absl::AbortedError(pending->second.failure.message());
  }
  return absl::OkStatus();
}

absl::Status StepRegistry::Admit(const StepKey& key, int trainer) {
  absl::MutexLock lock(&mu_);
  return AdmitLocked(key, trainer, /*staging=*/false);
}

absl::Status StepRegistry::Stage(const StepKey& key, int trainer_count, TrainerPayload payload) {
  absl::MutexLock lock(&mu_);
  const int trainer = payload.trainer_id;
  RETURN_IF_ERROR(AdmitLocked(key, trainer, /*staging=*/true));
  PendingStep& step = pending_[key];
  if (step.committing) {
    return absl::FailedPreconditionError(
        absl::StrCat("run '", key.run, "' step ", key.step, " is already being committed"));
  }
  if (step.payloads.empty()) {
    step.trainer_count = trainer_count;
  } else if (step.trainer_count != trainer_count) {
    return absl::InvalidArgumentError(absl::StrCat("trainer_count ", trainer_count, " differs from ",
                                                   step.trainer_count, " sent by other trainers of step ",
                                                   key.step));
  }
  if (!step.payloads.emplace(trainer, std::move(payload)).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("trainer ", trainer, " already staged run '", key.run, "' step ", key.step));
  }
  step.staged_ids.insert(trainer);
  return absl::OkStatus();
}

void StepRegistry::FailStaging(const StepKey& key, int trainer, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (outcomes_.count(key) > 0) return;
  PendingStep& step = pending_[key];
  if (step.committing || !step.failure.ok()) return;
  step.failure = status;
  step.told.insert(trainer);
  step.payloads.clear();
}

void StepRegistry::BeginRestore(const StepKey& key) {
  absl::MutexLock lock(&mu_);
  ++restoring_[key];
}

void StepRegistry::EndRestore(const StepKey& key) {
  absl::MutexLock lock(&mu_);
  if (--restoring_[key] <= 0) restoring_.erase(key);
}

void StepRegistry::AddStepWaiter(const StepKey& key, Waiter w) {
  std::optional<absl::Status> outcome;
  {
    absl::MutexLock lock(&mu_);
    auto done = outcomes_.find(key);
    if (done == outcomes_.end()) {
      pending_[key].waiters.push_back(std::move(w));
      return;
    }
    outcome = done->second;
  }
  w.done(*outcome);  // callbacks run without the lock
}

void StepRegistry::AddBarrierWaiter(const std::string& run, int64_t barrier_id, int trainer_id,
                                    int trainer_count, int64_t devices, int64_t mesh_size, Waiter w) {
  absl::MutexLock lock(&mu_);
  PendingBarrier& b = barriers_[{run, barrier_id}];
  b.trainer_counts.insert(trainer_count);
  b.mesh_size = std::max(b.mesh_size, mesh_size);
  b.arrivals.push_back({.trainer_id = trainer_id, .devices = devices, .waiter = std::move(w)});
}

internal::RoundState StepRegistry::Snapshot() {
  absl::MutexLock lock(&mu_);
  internal::RoundState state;
  for (const auto& [key, step] : pending_) {
    if ((step.payloads.empty() && step.failure.ok()) || step.committing) continue;
    internal::StepProgress* p = state.add_steps();
    p->set_run(key.run);
    p->set_step(key.step);
    p->set_trainer_count(step.trainer_count);
    p->set_staged(static_cast<int>(step.payloads.size()));
    for (const auto& [trainer, payload] : step.payloads) p->add_trainers(trainer);
    if (!step.failure.ok()) p->set_failure(std::string(step.failure.message()));
    for (int trainer : step.told) p->add_told(trainer);
  }
  for (const auto& [key, count] : restoring_) {
    internal::StepRef* r = state.add_restoring();
    r->set_run(key.run);
    r->set_step(key.step);
  }
  for (const auto& [key, b] : barriers_) {
    internal::BarrierProgress* p = state.add_barriers();
    p->set_run(key.first);
    p->set_barrier_id(key.second);
    p->set_trainer_count(*b.trainer_counts.rbegin());
    for (int count : b.trainer_counts) p->add_trainer_counts(count);
    p->set_arrived(static_cast<int>(b.arrivals.size()));
    int64_t devices = 0;
    for (const BarrierArrival& a : b.arrivals) {
      devices += a.devices;
      p->add_trainer_ids(a.trainer_id);
    }
    p->set_devices(devices);
    p->set_mesh_size(b.mesh_size);
  }
  return state;
}

std::vector<TrainerPayload> StepRegistry::TakeForCommit(const StepKey& key) {
  absl::MutexLock lock(&mu_);
  PendingStep& step = pending_[key];
  step.committing = true;
  std::vector<TrainerPayload> out;
  for (auto& [trainer, payload] : step.payloads) {
    for (const StagedTensor& t : payload.tensors) step.in_flight_bytes += t.bytes.size();
    out.push_back(std::move(payload));
  }
  step.payloads.clear();
  bytes_in_flight_ += step.in_flight_bytes;
  return out;
}

void StepRegistry::FinishStep(const StepKey& key, const absl::Status& outcome, int64_t bytes_written,
                              absl::Duration took, const std::set<int>& participants) {
  std::vector<Waiter> waiters;
  {
    absl::MutexLock lock(&mu_);
    std::set<int> told = participants;
    auto it = pending_.find(key);
    if (it != pending_.end()) {
      waiters = std::move(it->second.waiters);
      bytes_in_flight_ -= it->second.in_flight_bytes;
      told.insert(it->second.staged_ids.begin(), it->second.staged_ids.end());
      told.insert(it->second.told.begin(), it->second.told.end());
      pending_.erase(it);
    }
    if (outcome.ok()) last_commit_timing_[key.run] = {absl::Now(), took};
    outcomes_[key] = outcome;
    if (outcome.ok()) {
      told_.erase(key);
    } else {
      told_[key] = std::move(told);
    }
    outcome_order_.push_back(key);
    while (outcome_order_.size() > kOutcomesKept) {
      // A key retried after failing is listed twice; only its last listing forgets it.
      const StepKey oldest = outcome_order_.front();
      outcome_order_.pop_front();
      if (std::find(outcome_order_.begin(), outcome_order_.end(), oldest) == outcome_order_.end()) {
        outcomes_.erase(oldest);
        told_.erase(oldest);
      }
    }
    if (outcome.ok()) {
      int64_t& last = last_committed_.try_emplace(key.run, -1).first->second;
      if (key.step > last) last = key.step;
      bytes_written_ += bytes_written;
    }
  }
  for (Waiter& w : waiters) w.done(outcome);
}

void StepRegistry::FinishBarrier(const std::string& run, int64_t barrier_id, const absl::Status& outcome) {
  std::vector<Waiter> waiters;
  {
    absl::MutexLock lock(&mu_);
    auto it = barriers_.find({run, barrier_id});
    if (it == barriers_.end()) return;
    for (BarrierArrival& a : it->second.arrivals) waiters.push_back(std::move(a.waiter));
    barriers_.erase(it);
  }
  for (Waiter& w : waiters) w.done(outcome);
}

void StepRegistry::FailEverything(const absl::Status& status) {
  std::vector<Waiter> waiters;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [key, step] : pending_) {
      for (Waiter& w : step.waiters) waiters.push_back(std::move(w));
    }
    for (auto& [key, b] : barriers_) {
      for (BarrierArrival& a : b.arrivals) waiters.push_back(std::move(a.waiter));
    }
    pending_.clear();
    barriers_.clear();
  }
  for (Waiter& w : waiters) w.done(status);
}

void StepRegistry::DropCancelledWaiters() {
  std::vector<Waiter> dropped;
  auto sweep = [&dropped](std::vector<Waiter>& waiters) {
    for (size_t i = 0; i < waiters.size();) {
      if (waiters[i].cancelled && waiters[i].cancelled()) {
        dropped.push_back(std::move(waiters[i]));
        waiters.erase(waiters.begin() + static_cast<long>(i));
      } else {
        ++i;
      }
    }
  };
  {
    absl::MutexLock lock(&mu_);
    for (auto& [key, step] : pending_) sweep(step.waiters);
    // A trainer that gave up on a barrier no longer counts as arrived.
    for (auto it = barriers_.begin(); it != barriers_.end();) {
      std::vector<BarrierArrival>& arrivals = it->second.arrivals;
      for (size_t i = 0; i < arrivals.size();) {
        if (arrivals[i].waiter.cancelled && arrivals[i].waiter.cancelled()) {
          dropped.push_back(std::move(arrivals[i].waiter));
          arrivals.erase(arrivals.begin() + static_cast<long>(i));
        } else {
          ++i;
        }
      }
      it = arrivals.empty() ? barriers_.erase(it) : std::next(it);
    }
  }
  for (Waiter& w : dropped) w.done(absl::CancelledError("caller went away"));
}

std::vector<StepKey> StepRegistry::PendingSteps() {
  absl::MutexLock lock(&mu_);
  std::vector<StepKey> keys;
  for (const auto& [key, step] : pending_) {
    if (!step.payloads.empty() || step.committing) keys.push_back(key);
  }
  return keys;
}

void StepRegistry::SetGathering(std::vector<GatheringStep> steps) {
  absl::MutexLock lock(&mu_);
  gathering_ = std::move(steps);
}

std::vector<StepRegistry::GatheringStep> StepRegistry::Gathering() {
  absl::MutexLock lock(&mu_);
  return gathering_;
}

std::map<std::string, int64_t> StepRegistry::LastCommitted() {
  absl::MutexLock lock(&mu_);
  return last_committed_;
}

std::map<std::string, StepRegistry::CommitTiming> StepRegistry::LastCommitTimings() {
  absl::MutexLock lock(&mu_);
  return last_commit_timing_;
}

int64_t StepRegistry::bytes_in_flight() {
  absl::MutexLock lock(&mu_);
  return bytes_in_flight_;
}

int64_t StepRegistry::bytes_written() {
  absl::MutexLock lock(&mu_);
  return bytes_written_;
}

void StepRegistry::SetRankReports(std::vector<std::string> reports, absl::Time when) {
  absl::MutexLock lock(&mu_);
  rank_reports_ = std::move(reports);
  rank_reports_time_ = when;
}

std::pair<std::vector<std::string>, absl::Time> StepRegistry::RankReports() {
  absl::MutexLock lock(&mu_);
  return {rank_reports_, rank_reports_time_};
}

std::optional<absl::Status> StepRegistry::Outcome(const StepKey& key) {
  absl::MutexLock lock(&mu_);
  auto it = outcomes_.find(key);
  if (it == outcomes_.end()) return std::nullopt;
  return it->second;
}

void StepRegistry::NoteCommittedBeforeStart(const std::map<std::string, int64_t>& latest) {
  absl::MutexLock lock(&mu_);
  for (const auto& [run, step] : latest) last_committed_.emplace(run, step);
}

bool StepRegistry::KnowsRun(const std::string& run) {
  absl::MutexLock lock(&mu_);
  const auto of_run = [&run](const auto& keyed) {
    auto it = keyed.lower_bound(StepKey{run, std::numeric_limits<int64_t>::min()});
    return it != keyed.end() && it->first.run == run;
  };
  if (of_run(pending_) || of_run(outcomes_) || last_committed_.count(run) > 0) return true;
  auto barrier = barriers_.lower_bound({run, std::numeric_limits<int64_t>::min()});
  if (barrier != barriers_.end() && barrier->first.first == run) return true;
  return std::any_of(gathering_.begin(), gathering_.end(),
                     [&run](const GatheringStep& g) { return g.key.run == run; });
}

}  // namespace ckptd
