// DrainSchedule (config drain_to): when and what the job drains. Rank 0 orders the
// newest committed step of a run copied (one order at a time, newest first, steps
// divisible by drain_every_n_steps), every rank's Drainer copies its share, and rank
// 0 publishes the step into the drain root once every rank has (its retention:
// drain_keep_last). The orders and the progress travel in the coordinator's rounds.
// A RoundParticipant; coordinator thread only. Borrows everything it is given.
#ifndef CKPTD_DAEMON_COORD_DRAIN_SCHEDULE_H_
#define CKPTD_DAEMON_COORD_DRAIN_SCHEDULE_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "daemon/coord/round_participant.h"
#include "daemon/store/checkpoint_store.h"
#include "daemon/store/drain.h"

namespace ckptd {

struct DrainScheduleOptions {
  int rank = 0;
  int num_ranks = 1;
  const CheckpointStore* source = nullptr;  // the checkpoint root
  const CheckpointStore* drain = nullptr;   // the drain root
  Drainer* drainer = nullptr;               // this rank's copier
  int every_n_steps = 0;                    // drain only steps divisible by this (<= 1: all)
  int keep_last = 0;                        // the drain root's retention (0: keep all)
};

class DrainSchedule final : public RoundParticipant {
 public:
  explicit DrainSchedule(DrainScheduleOptions options) : options_(std::move(options)) {}

  void OnStart() override;
  void AddToRound(internal::RoundState* mine) override;
  bool OnRound(const std::vector<internal::RoundState>& all, const std::set<StepKey>& restoring) override;
  void Protect(const std::string& run, std::set<int64_t>* steps) const override;
  void OnConcluded(const StepOutcome& outcome) override;

 private:
  // Rank 0: the next order, for a run whose newest committed step is not drained yet.
  void NextOrder();
  // Rank 0: the order is complete on every rank; publishes it into the drain root.
  void Publish(const std::vector<internal::RoundState>& all, const std::set<StepKey>& restoring);

  const DrainScheduleOptions options_;
  // Rank 0's order in flight (seq 0: none), the runs it may still have to drain and
  // its order counter; on every rank, the order seen in the last round.
  internal::DrainOrder order_;
  std::set<std::string> runs_;
  int64_t seq_ = 0;
  internal::DrainOrder seen_;
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_COORD_DRAIN_SCHEDULE_H_
