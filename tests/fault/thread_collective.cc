#include "tests/fault/thread_collective.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/base/status.h"

namespace ckptd::testing {

class ThreadCollective : public Collective {
 public:
  ThreadCollective(ThreadGroup* group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size_; }
  void SetExpiryHandler(ExpiryHandler handler) override { on_expiry_ = std::move(handler); }

  absl::StatusOr<std::vector<std::string>> AllGather(const std::string& mine, absl::Time deadline) override {
    ASSIGN_OR_RETURN(ThreadGroup::Contributions all, group_->Exchange(rank_, mine, deadline, on_expiry_));
    return *all;
  }
  absl::StatusOr<std::vector<std::string>> Gather(const std::string& mine, int root,
                                                  absl::Time deadline) override {
    ASSIGN_OR_RETURN(ThreadGroup::Contributions all, group_->Exchange(rank_, mine, deadline, on_expiry_));
    if (rank_ != root) return std::vector<std::string>();
    return *all;
  }
  absl::StatusOr<std::string> Scatter(const std::vector<std::string>& parts, int root,
                                      absl::Time deadline) override {
    // The root's contribution is every part, each behind its length.
    std::string packed;
    if (rank_ == root) {
      for (const std::string& part : parts) absl::StrAppend(&packed, part.size(), ":", part);
    }
    ASSIGN_OR_RETURN(ThreadGroup::Contributions all,
                     group_->Exchange(rank_, std::move(packed), deadline, on_expiry_));
    absl::string_view rest = (*all)[static_cast<size_t>(root)];
    for (int r = 0;; ++r) {
      const size_t colon = rest.find(':');
      const size_t size = static_cast<size_t>(std::atoll(std::string(rest.substr(0, colon)).c_str()));
      if (r == rank_) return std::string(rest.substr(colon + 1, size));
      rest.remove_prefix(colon + 1 + size);
    }
  }
  absl::StatusOr<std::string> Broadcast(const std::string& value, int root, absl::Time deadline) override {
    ASSIGN_OR_RETURN(ThreadGroup::Contributions all, group_->Exchange(rank_, value, deadline, on_expiry_));
    return (*all)[static_cast<size_t>(root)];
  }
  absl::StatusOr<int> AllReduceMin(int value, absl::Time deadline) override {
    ASSIGN_OR_RETURN(ThreadGroup::Contributions all,
                     group_->Exchange(rank_, std::to_string(value), deadline, on_expiry_));
    int out = INT32_MAX;
    for (const std::string& v : *all) out = std::min(out, std::atoi(v.c_str()));
    return out;
  }
  absl::StatusOr<int64_t> AllReduceSum(int64_t value, absl::Time deadline) override {
    ASSIGN_OR_RETURN(ThreadGroup::Contributions all,
                     group_->Exchange(rank_, std::to_string(value), deadline, on_expiry_));
    int64_t out = 0;
    for (const std::string& v : *all) out += std::atoll(v.c_str());
    return out;
  }
  absl::Status Barrier(absl::Time deadline) override {
    return group_->Exchange(rank_, "", deadline, on_expiry_).status();
  }
  [[noreturn]] void Abort(int code) override { std::abort(); }

 private:
  ThreadGroup* group_;
  int rank_;
  ExpiryHandler on_expiry_;
};

std::vector<std::unique_ptr<Collective>> ThreadGroup::Members() {
  std::vector<std::unique_ptr<Collective>> members;
  for (int r = 0; r < size_; ++r) members.push_back(std::make_unique<ThreadCollective>(this, r));
  return members;
}

absl::StatusOr<ThreadGroup::Contributions> ThreadGroup::Exchange(int rank, std::string mine,
                                                                 absl::Time deadline,
                                                                 const Collective::ExpiryHandler& on_expiry) {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t my_generation = generation_;
  slots_[rank] = std::move(mine);
  present_[rank] = true;
  if (++arrived_ == size_) {
    results_ = std::make_shared<const std::vector<std::string>>(std::move(slots_));
    slots_.assign(static_cast<size_t>(size_), std::string());
    arrived_ = 0;
    present_.assign(size_, false);
    ++generation_;
    cv_.notify_all();
    return results_;
  }
  const absl::Duration interval = std::max(deadline - absl::Now(), absl::Milliseconds(100));
  while (generation_ == my_generation) {
    if (deadline == absl::InfiniteFuture()) {
      cv_.wait(lock);
      continue;
    }
    if (cv_.wait_until(lock, absl::ToChronoTime(deadline)) == std::cv_status::timeout &&
        generation_ == my_generation) {
      deadline = absl::Now() + interval;  // called again an interval later, as the MPI one
      std::vector<int> missing;
      for (int r = 0; r < size_; ++r) {
        if (!present_[r]) missing.push_back(r);
      }
      absl::Status late = absl::DeadlineExceededError(
          absl::StrCat("exchange on rank ", rank, " passed its deadline; rank(s) ",
                       absl::StrJoin(missing, ","), " never arrived"));
      if (!on_expiry) return late;
      lock.unlock();
      on_expiry(late);
      lock.lock();
    }
  }
  return results_;
}

}  // namespace ckptd::testing
