// The only user of <mpi.h>. Every collective is started non-blocking and polled until
// it completes or its deadline passes, sleeping between polls so an idle daemon does
// not spin a core.
#include <mpi.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
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
  }
  ~MpiCollective() override { MPI_Finalize(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::StatusOr<std::vector<std::string>> AllGather(const std::string& mine,
                                                     absl::Time deadline) override {
    int my_size = static_cast<int>(mine.size());
    std::vector<int> sizes(size_);
    MPI_Request req;
    RETURN_IF_ERROR(Check(MPI_Iallgather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT,
                                         MPI_COMM_WORLD, &req), "MPI_Iallgather"));
    RETURN_IF_ERROR(WaitFor(&req, deadline, "allgather of sizes"));
    std::vector<int> displs(size_);
    std::string all = Layout(sizes, &displs);
    RETURN_IF_ERROR(Check(MPI_Iallgatherv(mine.data(), my_size, MPI_BYTE, all.data(), sizes.data(),
                                          displs.data(), MPI_BYTE, MPI_COMM_WORLD, &req),
                          "MPI_Iallgatherv"));
    RETURN_IF_ERROR(WaitFor(&req, deadline, "allgatherv"));
    return Split(all, sizes, displs);
  }

  absl::StatusOr<std::vector<std::string>> Gather(const std::string& mine, int root,
                                                  absl::Time deadline) override {
    int my_size = static_cast<int>(mine.size());
    std::vector<int> sizes(size_);
    MPI_Request req;
    RETURN_IF_ERROR(Check(MPI_Igather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, root,
                                      MPI_COMM_WORLD, &req), "MPI_Igather"));
    RETURN_IF_ERROR(WaitFor(&req, deadline, "gather of sizes"));
    std::vector<int> displs(size_);
    std::string all = rank_ == root ? Layout(sizes, &displs) : std::string();
    RETURN_IF_ERROR(Check(MPI_Igatherv(mine.data(), my_size, MPI_BYTE, all.data(), sizes.data(),
                                       displs.data(), MPI_BYTE, root, MPI_COMM_WORLD, &req),
                          "MPI_Igatherv"));
    RETURN_IF_ERROR(WaitFor(&req, deadline, "gatherv"));
    if (rank_ != root) return std::vector<std::string>();
    return Split(all, sizes, displs);
  }

  absl::StatusOr<std::string> Broadcast(const std::string& value, int root,
                                        absl::Time deadline) override {
    int n = static_cast<int>(value.size());
    MPI_Request req;
    RETURN_IF_ERROR(Check(MPI_Ibcast(&n, 1, MPI_INT, root, MPI_COMM_WORLD, &req), "MPI_Ibcast"));
    RETURN_IF_ERROR(WaitFor(&req, deadline, "broadcast of size"));
    std::string out = rank_ == root ? value : std::string(static_cast<size_t>(n), '\0');
    RETURN_IF_ERROR(Check(MPI_Ibcast(out.data(), n, MPI_BYTE, root, MPI_COMM_WORLD, &req), "MPI_Ibcast"));
    RETURN_IF_ERROR(WaitFor(&req, deadline, "broadcast"));
    return out;
  }

  absl::StatusOr<int> AllReduceMin(int value, absl::Time deadline) override {
    int out = 0;
    MPI_Request req;
    RETURN_IF_ERROR(Check(MPI_Iallreduce(&value, &out, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &req),
                          "MPI_Iallreduce"));
    RETURN_IF_ERROR(WaitFor(&req, deadline, "allreduce"));
    return out;
  }

  absl::StatusOr<int64_t> AllReduceSum(int64_t value, absl::Time deadline) override {
    int64_t out = 0;
    MPI_Request req;
    RETURN_IF_ERROR(Check(MPI_Iallreduce(&value, &out, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD, &req),
                          "MPI_Iallreduce"));
    RETURN_IF_ERROR(WaitFor(&req, deadline, "allreduce"));
    return out;
  }

  absl::Status Barrier(absl::Time deadline) override {
    MPI_Request req;
    RETURN_IF_ERROR(Check(MPI_Ibarrier(MPI_COMM_WORLD, &req), "MPI_Ibarrier"));
    return WaitFor(&req, deadline, "barrier");
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

  // Polls with a sleep that grows from 20us to 1ms: quick when peers are ready,
  // cheap when they are not.
  absl::Status WaitFor(MPI_Request* req, absl::Time deadline, absl::string_view what) {
    absl::Duration nap = absl::Microseconds(20);
    while (true) {
      int done = 0;
      int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) return MpiError(rc, what);
      if (done) return absl::OkStatus();
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat("MPI ", what, " did not complete by its deadline on rank ",
                                                        rank_, ": another daemon is stalled or gone"));
      }
      absl::SleepFor(nap);
      nap = std::min(nap * 2, absl::Milliseconds(1));
    }
  }

  int rank_ = 0;
  int size_ = 1;
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
