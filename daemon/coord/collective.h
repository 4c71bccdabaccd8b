// Collective: the operations the daemons perform together, one rank per host. The MPI
// implementation is the only code that includes <mpi.h>; tests may substitute others.
// Not thread-safe: only the coordinator thread (the one that created it) calls it.
// Every operation takes a deadline. An MPI collective cannot be cancelled, so at the
// deadline the expiry handler (if set) is called once with DEADLINE_EXCEEDED naming
// the ranks that have not arrived (and again each further interval of the same
// length), and the operation keeps waiting for them; without
// a handler the operation returns DEADLINE_EXCEEDED and the group is unusable.
#ifndef CKPTD_DAEMON_COORD_COLLECTIVE_H_
#define CKPTD_DAEMON_COORD_COLLECTIVE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ckptd {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Every rank's bytes, indexed by rank.
  virtual absl::StatusOr<std::vector<std::string>> AllGather(const std::string& mine,
                                                             absl::Time deadline) = 0;
  // Every rank's bytes on `root`; an empty vector elsewhere.
  virtual absl::StatusOr<std::vector<std::string>> Gather(const std::string& mine, int root,
                                                          absl::Time deadline) = 0;
  // parts[r] as `root` passed it, on rank r (`parts` is read on `root` only, where it
  // holds size() strings): how rank 0 hands each rank its share of a plan it alone made.
  virtual absl::StatusOr<std::string> Scatter(const std::vector<std::string>& parts, int root,
                                              absl::Time deadline) = 0;
  // `value` as `root` passed it, on every rank.
  virtual absl::StatusOr<std::string> Broadcast(const std::string& value, int root, absl::Time deadline) = 0;
  // The minimum of `value` over all ranks.
  virtual absl::StatusOr<int> AllReduceMin(int value, absl::Time deadline) = 0;
  // The sum of `value` over all ranks.
  virtual absl::StatusOr<int64_t> AllReduceSum(int64_t value, absl::Time deadline) = 0;
  virtual absl::Status Barrier(absl::Time deadline) = 0;
  // Called on the coordinator thread when an operation passes its deadline.
  using ExpiryHandler = std::function<void(const absl::Status&)>;
  virtual void SetExpiryHandler(ExpiryHandler handler) = 0;
  // Once `stop_requested` returns true, an operation waits at most `grace` more for
  // the ranks it lacks, then returns UNAVAILABLE naming them: a rank asked to stop
  // must not wait forever for a peer that died. The group is unusable after that (MPI
  // collectives cannot be cancelled), so the process must exit without finalizing.
  // Implementations that cannot block forever may ignore it.
  virtual void SetStopCheck(std::function<bool()> stop_requested, absl::Duration grace) {
    (void)stop_requested;
    (void)grace;
  }
  // Ends the whole job; does not return.
  [[noreturn]] virtual void Abort(int code) = 0;
};

// Initializes MPI (thread level FUNNELED: the calling thread must make every later
// call) and returns a Collective over MPI_COMM_WORLD. MPI_Finalize runs when the
// returned object is destroyed.
absl::StatusOr<std::unique_ptr<Collective>> CreateMpiCollective(int* argc, char*** argv);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_COORD_COLLECTIVE_H_
