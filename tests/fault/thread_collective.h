// ThreadCollective: a Collective whose ranks are threads of one process, for driving
// the commit protocol of N "daemons" in a test without MPI. Same deadline contract as
// the MPI implementation: at the deadline the expiry handler hears which ranks have
// not arrived and the operation keeps waiting. Each rank's object is used by one thread.
#ifndef CKPTD_TESTS_FAULT_THREAD_COLLECTIVE_H_
#define CKPTD_TESTS_FAULT_THREAD_COLLECTIVE_H_

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/coord/collective.h"

namespace ckptd::testing {

class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), slots_(size), present_(size, false) {}
  // One Collective per rank; the group must outlive them.
  std::vector<std::unique_ptr<Collective>> Members();

 private:
  friend class ThreadCollective;
  // Deposits `mine`, waits for every rank, returns everyone's contributions (shared by
  // the ranks, which copy only what each needs: at 1,024 ranks a copy of everything
  // per rank would cost the scale model more than the commit it measures).
  using Contributions = std::shared_ptr<const std::vector<std::string>>;
  absl::StatusOr<Contributions> Exchange(int rank, std::string mine, absl::Time deadline,
                                         const Collective::ExpiryHandler& on_expiry);

  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> slots_;
  std::vector<bool> present_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  Contributions results_;
};

}  // namespace ckptd::testing

#endif  // CKPTD_TESTS_FAULT_THREAD_COLLECTIVE_H_
