// The only user of <mpi.h>. Every collective is started non-blocking and polled until
// it completes or its deadline passes, sleeping between polls so an idle daemon does
// not spin a core.
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/base/status.h"
#include "daemon/coord/collective.h"

namespace ckptd {
namespace {

absl::Status MpiError(int rc, absl::string_view op) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return absl::InternalError(absl::StrCat(op, ": ", absl::string_view(text, len)));
}

class MpiCollective : public Collective {
 public:
  MpiCollective() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // Arrival notes travel on their own communicator so they never match user traffic.
    MPI_Comm_dup(MPI_COMM_WORLD, &arrivals_);
  }
  ~MpiCollective() override {
    MPI_Comm_free(&arrivals_);
    MPI_Finalize();
  }

  void SetExpiryHandler(ExpiryHandler handler) override { on_expiry_ = std::move(handler); }
  void SetStopCheck(std::function<bool()> stop_requested, absl::Duration grace) override {
    stop_requested_ = std::move(stop_requested);
    stop_grace_ = grace;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::StatusOr<std::vector<std::string>> AllGather(const std::string& mine, absl::Time deadline) override {
    int my_size = static_cast<int>(mine.size());
    std::vector<int> sizes(size_);
    RETURN_IF_ERROR(Run(deadline, "allgather", [&](MPI_Request* req) {
      return MPI_Iallgather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD, req);
    }));
    std::vector<int> displs(size_);
    std::string all = Layout(sizes, &displs);
    RETURN_IF_ERROR(Run(deadline, "allgatherv", [&](MPI_Request* req) {
      return MPI_Iallgatherv(mine.data(), my_size, MPI_BYTE, all.data(), sizes.data(), displs.data(),
                             MPI_BYTE, MPI_COMM_WORLD, req);
    }));
    return Split(all, sizes, displs);
  }

  absl::StatusOr<std::vector<std::string>> Gather(const std::string& mine, int root,
                                                  absl::Time deadline) override {
    int my_size = static_cast<int>(mine.size());
    std::vector<int> sizes(size_);
    RETURN_IF_ERROR(Run(deadline, "gather", [&](MPI_Request* req) {
      return MPI_Igather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, root, MPI_COMM_WORLD, req);
    }));
    std::vector<int> displs(size_);
    std::string all = rank_ == root ? Layout(sizes, &displs) : std::string();
    RETURN_IF_ERROR(Run(deadline, "gatherv", [&](MPI_Request* req) {
      return MPI_Igatherv(mine.data(), my_size, MPI_BYTE, all.data(), sizes.data(), displs.data(), MPI_BYTE,
                          root, MPI_COMM_WORLD, req);
    }));
    if (rank_ != root) return std::vector<std::string>();
    return Split(all, sizes, displs);
  }

  absl::StatusOr<std::string> Scatter(const std::vector<std::string>& parts, int root,
                                      absl::Time deadline) override {
    std::vector<int> sizes(size_), displs(size_);
    std::string all;
    if (rank_ == root) {
      for (int r = 0; r < size_; ++r) sizes[r] = static_cast<int>(parts[r].size());
      all = Layout(sizes, &displs);
      for (int r = 0; r < size_; ++r) std::copy(parts[r].begin(), parts[r].end(), all.begin() + displs[r]);
    }
    int my_size = 0;
    RETURN_IF_ERROR(Run(deadline, "scatter", [&](MPI_Request* req) {
      return MPI_Iscatter(sizes.data(), 1, MPI_INT, &my_size, 1, MPI_INT, root, MPI_COMM_WORLD, req);
    }));
    std::string mine(static_cast<size_t>(my_size), '\0');
    RETURN_IF_ERROR(Run(deadline, "scatterv", [&](MPI_Request* req) {
      return MPI_Iscatterv(all.data(), sizes.data(), displs.data(), MPI_BYTE, mine.data(), my_size, MPI_BYTE,
                           root, MPI_COMM_WORLD, req);
    }));
    return mine;
  }

  absl::StatusOr<std::string> Broadcast(const std::string& value, int root, absl::Time deadline) override {
    int n = static_cast<int>(value.size());
    RETURN_IF_ERROR(Run(deadline, "broadcast", [&](MPI_Request* req) {
      return MPI_Ibcast(&n, 1, MPI_INT, root, MPI_COMM_WORLD, req);
    }));
    std::string out = rank_ == root ? value : std::string(static_cast<size_t>(n), '\0');
    RETURN_IF_ERROR(Run(deadline, "broadcast", [&](MPI_Request* req) {
      return MPI_Ibcast(out.data(), n, MPI_BYTE, root, MPI_COMM_WORLD, req);
    }));
    return out;
  }

  absl::StatusOr<int> AllReduceMin(int value, absl::Time deadline) override {
    int out = 0;
    RETURN_IF_ERROR(Run(deadline, "allreduce", [&](MPI_Request* req) {
      return MPI_Iallreduce(&value, &out, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, req);
    }));
    return out;
  }

  absl::StatusOr<int64_t> AllReduceSum(int64_t value, absl::Time deadline) override {
    int64_t out = 0;
    RETURN_IF_ERROR(Run(deadline, "allreduce", [&](MPI_Request* req) {
      return MPI_Iallreduce(&value, &out, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD, req);
    }));
    return out;
  }

  absl::Status Barrier(absl::Time deadline) override {
    return Run(deadline, "barrier", [&](MPI_Request* req) { return MPI_Ibarrier(MPI_COMM_WORLD, req); });
  }

  [[noreturn]] void Abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::abort();  // MPI_Abort does not return; this satisfies [[noreturn]]
  }

 private:
  static absl::Status Check(int rc, absl::string_view op) {
    return rc == MPI_SUCCESS ? absl::OkStatus() : MpiError(rc, op);
  }

  static std::string Layout(const std::vector<int>& sizes, std::vector<int>* displs) {
    int64_t total = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      (*displs)[i] = static_cast<int>(total);
      total += sizes[i];
    }
    return std::string(static_cast<size_t>(total), '\0');
  }

  static std::vector<std::string> Split(const std::string& all, const std::vector<int>& sizes,
                                        const std::vector<int>& displs) {
    std::vector<std::string> out;
    for (size_t i = 0; i < sizes.size(); ++i) out.push_back(all.substr(displs[i], sizes[i]));
    return out;
  }

  // Every collective is preceded by an arrival note from each rank to every other, so
  // that a rank whose deadline passes can name the ranks that never arrived.
  struct Arrivals {
    std::vector<MPI_Request> requests;
    std::vector<int64_t> received;
    // The send buffer of the notes: on the heap, because MPI reads it after Announce
    // returns (over TCP the send is deferred) and the Arrivals is moved meanwhile. A
    // member value here was read out of scope (AddressSanitizer, 3 hosts over TCP).
    std::unique_ptr<int64_t> sequence = std::make_unique<int64_t>(0);
  };

  Arrivals Announce() {
    Arrivals a;
    *a.sequence = ++sequence_;
    const int tag = static_cast<int>(*a.sequence % 30000);
    a.received.assign(size_, 0);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      MPI_Request r;
      MPI_Irecv(&a.received[peer], 1, MPI_INT64_T, peer, tag, arrivals_, &r);
      a.requests.push_back(r);
      MPI_Isend(a.sequence.get(), 1, MPI_INT64_T, peer, tag, arrivals_, &r);
      a.requests.push_back(r);
    }
    return a;
  }

  // Why the current operation has not finished, for an error message.
  std::string WhoIsMissing() {
    const std::vector<int> missing = Missing(current_);
    if (missing.empty()) return "every rank arrived but the operation has not finished";
    return absl::StrCat("rank(s) ", JoinBounded(missing), " never arrived");
  }

  std::vector<int> Missing(Arrivals& a) {
    std::vector<int> missing;
    size_t index = 0;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      int done = 0;
      MPI_Test(&a.requests[index], &done, MPI_STATUS_IGNORE);  // the receive from `peer`
      if (!done) missing.push_back(peer);
      index += 2;
    }
    return missing;
  }

  // Polls with a sleep that grows from 20us to 1ms: quick when peers are ready,
  // cheap when they are not.
  absl::Status WaitFor(MPI_Request* req, absl::Time deadline, absl::string_view what) {
    absl::Duration nap = absl::Microseconds(20);
    // After each expiry the handler is called again one more interval later, so work
    // that arrives while this rank is stuck waiting is failed too, not left hanging.
    const absl::Duration interval = std::max(deadline - absl::Now(), absl::Milliseconds(100));
    while (true) {
      int done = 0;
      int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) return MpiError(rc, what);
      if (done) break;
      if (stop_requested_ && stop_requested_()) {
        if (stop_seen_ == absl::InfiniteFuture()) stop_seen_ = absl::Now();
        if (absl::Now() - stop_seen_ > stop_grace_) {
          return absl::UnavailableError(absl::StrCat("stopping: MPI ", what, " on rank ", rank_,
                                                     " gave up after ", absl::FormatDuration(stop_grace_),
                                                     "; ", WhoIsMissing()));
        }
      }
      if (absl::Now() > deadline) {
        deadline = absl::Now() + interval;
        absl::Status late = absl::DeadlineExceededError(
            absl::StrCat("MPI ", what, " on rank ", rank_, " passed its deadline; ", WhoIsMissing()));
        if (!on_expiry_) return late;
        on_expiry_(late);
      }
      absl::SleepFor(nap);
      nap = std::min(nap * 2, absl::Milliseconds(1));
    }
    return absl::OkStatus();
  }

  // Runs one collective: announce, start it, wait, then settle the arrival notes
  // (every peer has entered, so they complete).
  template <typename Start>
  absl::Status Run(absl::Time deadline, absl::string_view what, Start start) {
    current_ = Announce();
    MPI_Request req;
    absl::Status s = Check(start(&req), what);
    if (s.ok()) s = WaitFor(&req, deadline, what);
    if (s.ok())
      MPI_Waitall(static_cast<int>(current_.requests.size()), current_.requests.data(), MPI_STATUSES_IGNORE);
    return s;
  }

  int rank_ = 0;
  int size_ = 1;
  MPI_Comm arrivals_;
  int64_t sequence_ = 0;
  Arrivals current_;
  ExpiryHandler on_expiry_;
  std::function<bool()> stop_requested_;
  absl::Duration stop_grace_ = absl::Seconds(1);
  absl::Time stop_seen_ = absl::InfiniteFuture();  // when this rank first saw the stop
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collective>> CreateMpiCollective(int* argc, char*** argv) {
  int provided = 0;
  int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Init_thread");
  if (provided < MPI_THREAD_FUNNELED) {
    return absl::FailedPreconditionError("MPI does not provide MPI_THREAD_FUNNELED");
  }
  // Errors come back as codes, to become Status values, instead of aborting the job.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return std::unique_ptr<Collective>(new MpiCollective());
}

}  // namespace ckptd
