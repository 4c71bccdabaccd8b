// StepRegistry: the state gRPC handlers and the coordinator share. Handlers stage
// payloads and register waiters (never blocking); the coordinator snapshots progress
// for each round, takes staged payloads to commit, and completes waiters.
// Thread-safe: one mutex; waiter callbacks run without it held, on the caller's thread.
#ifndef CKPTD_DAEMON_COORD_STEP_REGISTRY_H_
#define CKPTD_DAEMON_COORD_STEP_REGISTRY_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ckptd/internal/coord.pb.h"
#include "daemon/staging/staging_area.h"

namespace ckptd {

struct StepKey {
  std::string run;
  int64_t step = 0;
  friend bool operator<(const StepKey& a, const StepKey& b) {
    return std::tie(a.run, a.step) < std::tie(b.run, b.step);
  }
  friend bool operator==(const StepKey& a, const StepKey& b) { return a.run == b.run && a.step == b.step; }
};

struct Waiter {
  std::function<bool()> cancelled;  // polled; a cancelled waiter is dropped
  std::function<void(const absl::Status&)> done;
};

// A failed step and its retry: once an attempt of a step has failed (a trainer's Save
// broke, a plan was invalid, a deadline passed), every trainer of that step gets
// ABORTED with the original cause, whether it had staged already (through Wait) or
// arrives later (its Save is refused at the header). A trainer that has already been
// told of the failure (it staged, it was refused, or its own Save broke) and saves the
// step again starts a fresh attempt, which every other trainer then joins.
class StepRegistry {
 public:
  // Called when a Save header for `key` is accepted, before any bytes arrive. OK, or
  // ALREADY_EXISTS if the step is committed, or ABORTED with the original cause if an
  // attempt of the step failed and `trainer` had not been told (it is now).
  absl::Status Admit(const StepKey& key, int trainer);

  // Stages one trainer's payload. As Admit, plus ALREADY_EXISTS if the trainer already
  // staged this step; FAILED_PRECONDITION if the step is being committed;
  // INVALID_ARGUMENT if trainer_count differs from other local trainers of the step.
  absl::Status Stage(const StepKey& key, int trainer_count, TrainerPayload payload);

  // Trainer `trainer`'s Save for the step failed after its header was accepted (stream
  // cut, bad data): the step is doomed, and every rank will fail it with `status`.
  // Frees what this host staged for it.
  void FailStaging(const StepKey& key, int trainer, const absl::Status& status);

  // Restores in progress; retention leaves these steps alone.
  void BeginRestore(const StepKey& key);
  void EndRestore(const StepKey& key);
  // A restore in progress for the life of the object.
  class RestorePin {
   public:
    RestorePin(StepRegistry* registry, StepKey key) : registry_(registry), key_(std::move(key)) {
      registry_->BeginRestore(key_);
    }
    ~RestorePin() { registry_->EndRestore(key_); }
    RestorePin(const RestorePin&) = delete;
    RestorePin& operator=(const RestorePin&) = delete;

   private:
    StepRegistry* registry_;
    StepKey key_;
  };

  // Calls w.done now if the step's outcome is known, else when it is.
  void AddStepWaiter(const StepKey& key, Waiter w);
  // `devices` and `mesh_size` are 0 when the trainer declared no mesh.
  void AddBarrierWaiter(const std::string& run, int64_t barrier_id, int trainer_id, int trainer_count,
                        int64_t devices, int64_t mesh_size, Waiter w);

  // Coordinator side.
  internal::RoundState Snapshot();
  std::vector<TrainerPayload> TakeForCommit(const StepKey& key);
  // `took`: the commit's duration, reported by Status for the run's last commit.
  // `participants`: trainers that learn a failed outcome here (see the class comment);
  // the trainers staged on this host always do.
  void FinishStep(const StepKey& key, const absl::Status& outcome, int64_t bytes_written,
                  absl::Duration took = absl::ZeroDuration(), const std::set<int>& participants = {});
  void FinishBarrier(const std::string& run, int64_t barrier_id, const absl::Status& outcome);
  void FailEverything(const absl::Status& status);
  void DropCancelledWaiters();

  // The newest committed step of each run found on disk at start, so that Status
  // names a run's last commit after a restart; a run committed since keeps its own.
  void NoteCommittedBeforeStart(const std::map<std::string, int64_t>& latest);

  // Status reporting.
  std::vector<StepKey> PendingSteps();
  std::map<std::string, int64_t> LastCommitted();
  struct CommitTiming {
    absl::Time when;
    absl::Duration took;
  };
  // Of the last step of each run this daemon committed.
  std::map<std::string, CommitTiming> LastCommitTimings();
  int64_t bytes_written();
  int64_t bytes_in_flight();
  // Every rank's serialized status, by rank, as the last round gathered them.
  void SetRankReports(std::vector<std::string> reports, absl::Time when);
  std::pair<std::vector<std::string>, absl::Time> RankReports();
  // Whether any step or barrier of `run` is staged, committing, gathering job-wide,
  // or remembered here (a run only on disk is the store's to say).
  bool KnowsRun(const std::string& run);
  // OK/error if the outcome is remembered; nullopt otherwise.
  std::optional<absl::Status> Outcome(const StepKey& key);
  // A step still gathering trainers as the coordinator saw it job-wide in its last
  // round (set by the coordinator thread, read by Status).
  struct GatheringStep {
    StepKey key;
    int trainer_count = 0;
    int trainers_staged = 0;     // on every host together
    std::vector<int> missing{};  // trainer ids that have not staged
    absl::Time deadline{};       // the step fails then unless they do
  };
  void SetGathering(std::vector<GatheringStep> steps);
  std::vector<GatheringStep> Gathering();

 private:
  struct PendingStep {
    int trainer_count = 0;
    bool committing = false;
    int64_t in_flight_bytes = 0;
    absl::Status failure;
    std::map<int, TrainerPayload> payloads;
    std::set<int> staged_ids;  // every trainer that staged, kept after TakeForCommit
    std::set<int> told;        // trainers that know `failure`
    std::vector<Waiter> waiters;
  };
  struct BarrierArrival {
    int trainer_id = 0;
    int64_t devices = 0;
    Waiter waiter;
  };
  struct PendingBarrier {
    std::set<int> trainer_counts;  // more than one: the trainers disagree
    int64_t mesh_size = 0;
    std::vector<BarrierArrival> arrivals;
  };
  static constexpr size_t kOutcomesKept = 4096;

  // The Admit check, with mu_ held; `staging` when the trainer's bytes are in.
  absl::Status AdmitLocked(const StepKey& key, int trainer, bool staging) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::map<StepKey, PendingStep> pending_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, int64_t>, PendingBarrier> barriers_ ABSL_GUARDED_BY(mu_);
  std::map<StepKey, absl::Status> outcomes_ ABSL_GUARDED_BY(mu_);
  std::map<StepKey, std::set<int>> told_ ABSL_GUARDED_BY(mu_);  // of failed outcomes: who knows
  std::deque<StepKey> outcome_order_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> last_committed_ ABSL_GUARDED_BY(mu_);
  std::map<StepKey, int> restoring_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, CommitTiming> last_commit_timing_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_written_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<GatheringStep> gathering_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> rank_reports_ ABSL_GUARDED_BY(mu_);
  absl::Time rank_reports_time_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_COORD_STEP_REGISTRY_H_
