// Coordinator: the daemon's single MPI thread. It runs rounds in lockstep with the
// other ranks: each round all ranks exchange what they have staged (and which barriers
// trainers wait in); a step every trainer of the job has staged is committed by all
// ranks together (plan, write, vote, merge, publish). Owns nothing but borrowed
// pointers, which must outlive Run(). Only the thread that created the Collective
// may call Run().
#ifndef CKPTD_DAEMON_COORD_COORDINATOR_H_
#define CKPTD_DAEMON_COORD_COORDINATOR_H_

#include <atomic>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "daemon/base/storage_mode.h"
#include "daemon/coord/collective.h"
#include "daemon/coord/commit_observer.h"
#include "daemon/coord/drain_schedule.h"
#include "daemon/coord/parity.h"
#include "daemon/coord/replicas.h"
#include "daemon/coord/round_participant.h"
#include "daemon/coord/step_registry.h"
#include "daemon/plan/save_plan.h"
#include "daemon/store/checkpoint_store.h"

namespace ckptd {

struct CoordinatorOptions {
  absl::Duration commit_timeout = absl::Seconds(60);
  std::string version{};
  int keep_last = 0;           // retention; 0 = keep every step
  int keep_every_n_steps = 0;  // also keep steps divisible by this; 0 = none
  // This rank's status report (see RoundState.report); called on the coordinator
  // thread, so it must be thread-safe with respect to the service. May be empty.
  std::function<std::string()> local_report{};
  // Threads that checksum boxes while the coordinator thread writes them.
  int checksum_threads = 2;
  // After a stop request, how long a collective waits for peers before this rank
  // stops without them (a dead peer must not keep a SIGTERMed daemon alive).
  absl::Duration stop_grace = absl::Seconds(1);
  // Mode of the directories a commit creates (0700 private, 0750 with a group).
  uint32_t dir_mode = 0700;
  // kShared: rank 0 prepares, merges and publishes into the root every rank sees.
  // kLocal: every rank does so in its own root, with rank 0's index sent to all.
  Storage storage = Storage::kShared;
  // Drain (config drain_to): the drain root and this rank's drainer, both null without
  // one. Rank 0 orders committed steps drained (those divisible by
  // drain_every_n_steps, every step when <= 1), newest first, one at a time, and
  // publishes each once every rank copied its share; drain_keep_last is the drain
  // root's retention (0 = keep all). The coordinator runs it as a RoundParticipant
  // (DrainSchedule) of its own.
  const CheckpointStore* drain_store = nullptr;
  Drainer* drainer = nullptr;
  int drain_every_n_steps = 0;
  int drain_keep_last = 0;
};

class Coordinator {
 public:
  Coordinator(Collective* collective, StepRegistry* registry, CheckpointStore* store,
              CoordinatorOptions options);

  // Runs rounds until every rank has seen a stop request (any rank's `stop` turning
  // true stops all of them together). Pending steps then fail with UNAVAILABLE and
  // nothing partial is published. UNAVAILABLE means this rank was asked to stop but
  // some peer did not join it within options.stop_grace (dead, stopped, or stuck): the
  // same has been done here, but the collective is unusable, so the process must exit
  // without finalizing MPI. Any other non-OK return means a collective failed: the job
  // must be aborted.
  absl::Status Run(const std::atomic<bool>& stop);

  // Start-up check of the roots against options.storage: every rank writes a token
  // into its root and looks for the others'. Shared: every rank must see every
  // token (one root). Local: none may see another's (a root of its own). Otherwise
  // FAILED_PRECONDITION on every rank, naming the rank and host. The drain root, when
  // there is one, must be shared. Call before Run.
  absl::Status CheckRoot();
  // Local storage: a crash between the hosts' publishes can leave a step published on
  // some hosts only, and a host can lose its disk. With replicas, every rank copies
  // back what it lacks of a step whose data files all survive somewhere (its index,
  // ckptd.json, its own file and the copies it keeps); any other step not on every
  // host is taken back, so that no daemon reports a step it cannot restore. Call after
  // CheckRoot, and with replicas after SetReplicas (the peers must be serving).
  absl::Status ReconcileLocalSteps();
  // Every rank's PeerInfo (in rank order) for the one this rank gives; rank 0's token
  // is the job's. Call before Run.
  absl::StatusOr<std::vector<internal::PeerInfo>> ExchangePeerInfo(const internal::PeerInfo& mine);
  // Rank 0's `value` on every rank (others pass anything). Call before Run.
  absl::StatusOr<std::string> ShareFromRankZero(const std::string& value);
  // Local storage with replicas: copies[r] are the ranks that keep a copy of rank r's
  // data file (PlaceReplicas), fetched through `copier`, which must outlive Run. Every
  // rank must be given the same copies. Call before Run.
  void SetReplicas(std::vector<std::vector<int>> copies, ShardCopier* copier);
  // Local storage with redundancy parity: the groups (PlaceParityGroups, the same on
  // every rank) and `parity` chunks per stripe; each commit's parity phase reads the
  // group's data files through `copier`, which must outlive Run. Call before Run.
  void SetParity(ParityGroups groups, int parity, ShardCopier* copier);
  // Commit-time work of a storage tier or of metrics (see CommitObserver), called in
  // the order added. Call before Run; `observer` must outlive Run.
  void AddObserver(CommitObserver* observer) { observers_.push_back(observer); }
  // Work of a tier that runs with the rounds (see RoundParticipant); it observes the
  // commits too. Call before Run; `participant` must outlive Run.
  void AddParticipant(RoundParticipant* participant) {
    participants_.push_back(participant);
    observers_.push_back(participant);
  }

 private:
  struct RoundTally;
  struct StepHolders;
  // CheckRoot of one root: every rank must see every other's token (kShared) or none.
  absl::Status CheckSharing(const CheckpointStore& where, Storage expected, bool drain);
  absl::Status ListHeldSteps(internal::StepList* mine);
  // Copies what this rank lacks of a step from the ranks that hold it.
  absl::Status RepairStep(const StepKey& key, const StepHolders& holders, absl::Time deadline);
  // One coordination round: every rank's RoundState gathered, tallied, and the steps
  // and barriers that are ready committed, completed or failed. Returns true if the
  // round did any work; sets *stopping when some rank is stopping.
  absl::StatusOr<bool> Round(bool stop_requested, bool* stopping);
  // What this rank tells the others this round: its staged steps and barriers, those
  // past their deadline here, its stop request and status report.
  internal::RoundState LocalRoundState(bool stop_requested, absl::Time now);
  static absl::StatusOr<RoundTally> Tally(const std::vector<std::string>& all);
  absl::StatusOr<bool> DecideSteps(const RoundTally& round, absl::Time now);
  absl::StatusOr<bool> DecideBarriers(const RoundTally& round, const internal::RoundState& mine,
                                      absl::Time now);
  absl::Status CommitStep(const StepKey& key, int trainer_count);
  // Agrees on one status: OK if every rank's is OK, else the lowest failing rank's.
  absl::StatusOr<absl::Status> Vote(const absl::Status& mine, absl::Time deadline);
  // Writes this rank's boxes into its data file and syncs it; each box's staged
  // memory is freed as soon as it is written and checksummed, unless an observer takes
  // the written buffers (OnWritten, before they are freed).
  absl::Status WriteLocalShard(const StepKey& key, const SavePlan& plan,
                               std::vector<TrainerPayload>& payloads, std::string* entries_out,
                               int64_t* bytes_out);
  absl::Status Publish(const StepKey& key);
  // After rank 0 published: this rank sees the step directory, the index and its own
  // data file at the size it wrote.
  absl::Status CheckPublishedHere(const StepKey& key, int64_t bytes_written);
  // Takes a step this rank published back, when the vote after publishing failed.
  void Withdraw(const StepKey& key, const absl::Status& why);
  // State file without the step first, then the step renamed back to its temp
  // directory (which the commit's failure path removes).
  void TakeBack(const StepKey& key);
  void ApplyRetention(const StepKey& key);
  void OnExpiry(const absl::Status& late);
  // `s`, unless a deadline already failed `key` on this rank.
  absl::Status LocalStatus(const StepKey& key, const absl::Status& s) const;
  // `s` naming this rank and host, so that every rank's log and every trainer's error
  // say where a step failed.
  absl::Status Where(const absl::Status& s) const;
  // A barrier every trainer id arrived at: checks the mesh's device count across hosts.
  absl::Status CompleteBarrier(const std::pair<std::string, int64_t>& key, int64_t mesh_size,
                               const internal::RoundState& mine);

  // What a collective that passes its deadline now would leave undone: the one thing
  // OnExpiry may touch. OnExpiry (called by the Collective on this thread, from inside
  // a wait) fails these steps and barriers on this rank, unless final_outcome (past the
  // publish, the outcome is rank 0's to announce); it touches nothing else of a commit.
  struct Phase {
    std::vector<StepKey> steps{};
    std::vector<std::pair<std::string, int64_t>> barriers{};
    bool final_outcome = false;
    bool idle = false;  // a round that began with nothing staged here
  };
  // Sets the phase for a scope; the phase is empty again when the scope ends.
  class PhaseScope {
   public:
    PhaseScope(Phase* phase, Phase value) : phase_(phase) { *phase_ = std::move(value); }
    ~PhaseScope() { *phase_ = Phase{}; }
    PhaseScope(const PhaseScope&) = delete;
    PhaseScope& operator=(const PhaseScope&) = delete;

   private:
    Phase* phase_;
  };

  // One attempt to commit a step. The commit runs as phases (plan, prepare, write,
  // merge, publish, confirm), each ending in a vote of every rank; the first vote that
  // fails ends the attempt the same way everywhere.
  struct Attempt {
    StepKey key{};
    int trainer_count = 0;
    absl::Time started{};
    absl::Time deadline{};
    std::vector<TrainerPayload> payloads{};  // staged here; freed once written
    SavePlan plan{};
    std::string entries{};        // this rank's written entries (internal::WrittenEntries)
    int64_t bytes = 0;            // this rank's data file size
    bool published_here = false;  // this rank renamed its temp directory into place
    absl::Status agreed{};        // the last vote
    double commit_seconds = 0;    // rank 0's measure, which every rank reports (StepFiles)
  };
  // Phases: a non-OK return means a collective failed (the job must be aborted);
  // *mine is this rank's own outcome, which the vote that follows combines.
  // The plan: on rank 0 the whole of it, elsewhere the boxes this rank writes.
  absl::Status PlanPhase(Attempt& attempt, absl::StatusOr<SavePlan>* plan);
  absl::Status PreparePhase(Attempt& attempt, absl::Status* mine);
  absl::Status WritePhase(Attempt& attempt, absl::Status* mine);
  absl::Status ReplicatePhase(Attempt& attempt, absl::Status* mine);
  absl::Status ParityPhase(Attempt& attempt, absl::Status* mine);
  // The parity phase's work on this rank: its parity file of the step, written into
  // the temp directory; its size and crc32c, and the group's segment size, appended
  // to attempt.entries.
  absl::Status WriteParityFile(Attempt& attempt, const std::vector<int64_t>& file_sizes);
  absl::Status MergePhase(Attempt& attempt, absl::Status* mine);
  absl::Status PublishPhase(Attempt& attempt, absl::Status* mine);
  absl::Status ConfirmPhase(Attempt& attempt, absl::Status* mine);
  // Whether this rank prepares, merges into and publishes a step directory: rank 0 on
  // a shared root, every rank on local roots.
  bool Publishes() const { return options_.storage == Storage::kLocal || collective_->rank() == 0; }
  // Removes orphans and the step's old temp directory, creates a fresh one.
  absl::Status PrepareTempDir(const StepKey& key);
  // Rank 0: the step's index and ckptd.json from every rank's written entries.
  absl::StatusOr<internal::StepFiles> BuildStepFiles(const StepKey& key, int trainer_count,
                                                     const SavePlan& plan,
                                                     const std::vector<std::string>& gathered,
                                                     absl::Time started);
  // Writes them into the step's temp directory, durably.
  absl::Status WriteStepFiles(const StepKey& key, const internal::StepFiles& files);
  // Cleans up, logs, and tells the trainers the attempt's outcome.
  void Conclude(Attempt& attempt);
  // A publisher's part of the end of a step: a failed step's temp directory removed;
  // a committed one's retention applied and its lost-step record cleared.
  void ConcludePublished(const StepKey& key, const absl::Status& agreed);
  // Tells every observer how a step ended (see CommitObserver::OnConcluded).
  void NotifyConcluded(const StepOutcome& outcome);

  Collective* collective_;
  StepRegistry* registry_;
  CheckpointStore* store_;
  CoordinatorOptions options_;
  Phase phase_;
  std::map<StepKey, absl::Status> failed_here_;   // steps a deadline failed on this rank
  std::vector<std::vector<int>> replica_copies_;  // see SetReplicas; empty = no replicas
  ShardCopier* copier_ = nullptr;
  int parity_ = 0;  // see SetParity; 0 = no parity
  ParityGroups parity_groups_;
  std::vector<CommitObserver*> observers_;       // see AddObserver
  std::vector<RoundParticipant*> participants_;  // see AddParticipant
  std::optional<DrainSchedule> drain_;           // with options_.drainer; a participant
  std::map<StepKey, absl::Time> first_seen_;     // pending steps, since when
  std::map<std::pair<std::string, int64_t>, absl::Time> barrier_first_seen_;  // waiting barriers
  std::set<std::string> cleaned_runs_;  // runs whose orphans this rank removed
  std::set<StepKey> restoring_;         // steps being restored on some host
  std::string report_;                  // cached local_report()
  absl::Time report_time_ = absl::InfinitePast();
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_COORD_COORDINATOR_H_
