// RoundParticipant: work of a storage tier that runs with the coordinator's rounds
// rather than with one commit (the drain: rank 0 orders a committed step copied,
// every rank copies its share, rank 0 publishes it once all have). It adds to this
// rank's RoundState before the all-gather and reads every rank's after it; as a
// CommitObserver it also hears each step's outcome. Registered once at start-up
// (Coordinator::AddParticipant); every method runs on the coordinator thread.
#ifndef CKPTD_DAEMON_COORD_ROUND_PARTICIPANT_H_
#define CKPTD_DAEMON_COORD_ROUND_PARTICIPANT_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "ckptd/internal/coord.pb.h"
#include "daemon/coord/commit_observer.h"
#include "daemon/coord/step_registry.h"

namespace ckptd {

class RoundParticipant : public CommitObserver {
 public:
  // Before the first round.
  virtual void OnStart() {}
  // Adds this rank's part to the state every rank gathers this round.
  virtual void AddToRound(internal::RoundState* mine) {}
  // Every rank's state of this round, by rank, and the steps being restored anywhere;
  // whether it did any work (the coordinator naps after a round without work).
  virtual bool OnRound(const std::vector<internal::RoundState>& all, const std::set<StepKey>& restoring) {
    return false;
  }
  // Adds the steps of `run` that retention must leave alone now.
  virtual void Protect(const std::string& run, std::set<int64_t>* steps) const {}
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_COORD_ROUND_PARTICIPANT_H_
