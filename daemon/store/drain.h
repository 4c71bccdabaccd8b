// Drain (config drain_to): committed steps copied from the checkpoint root into a
// second root on durable storage (a shared or remote-mounted directory), in the
// background and throttled, as complete TF checkpoints that tf.train.load_checkpoint
// and offline ckptctl read where they lie.
//
// Every rank copies its own share of a step (the data files its rank wrote; rank 0
// also the index and ckptd.json) into the step's drain temp directory; rank 0 renames
// that into place once every rank has reported its share (the coordinator decides,
// over its rounds). Crash-safe like a commit: a file is copied under a ".partial" name
// and renamed once synced, a temp directory is never read as a checkpoint, and a drain
// that a crash interrupted resumes into the same temp directory (its id names the
// commit, so another commit of the same step number starts afresh).
//
// Drainer owns one background thread; Start, Cancel and Poll are called from the
// coordinator thread. The free functions are stateless and thread-safe as the stores'
// file systems are.
#ifndef CKPTD_DAEMON_STORE_DRAIN_H_
#define CKPTD_DAEMON_STORE_DRAIN_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/store/checkpoint_store.h"

namespace ckptd {

struct DrainJob {
  int64_t seq = 0;  // the coordinator's order number
  std::string run{};
  int64_t step = 0;
  std::string id{};  // CommitId of the step
  int rank = 0;      // whose share this drainer copies
  int num_ranks = 1;
};

// The temp directory a drain of this commit copies into.
std::string DrainTempDir(const CheckpointStore& drain, const std::string& run, int64_t step,
                         const std::string& id);

// Identifies one commit of a step: the crc32c of its ckptd.json, in hex.
absl::StatusOr<std::string> CommitId(const CheckpointStore& store, const std::string& run, int64_t step);

// The files of a committed step that rank `rank` of `num_ranks` drains: the data files
// of the ranks it stands for (rank r of the saving job by r % num_ranks), and on rank
// 0 the index and ckptd.json too. Names are relative to the step directory.
absl::StatusOr<std::vector<std::string>> DrainShare(const CheckpointStore& source, const std::string& run,
                                                    int64_t step, int rank, int num_ranks);

// The newest committed step of `run` in `source` that the drain should hold and does
// not: a step divisible by every_n_steps (every step when it is 0 or 1), newer than
// the newest step already drained. nullopt when there is none.
absl::StatusOr<std::optional<int64_t>> NextStepToDrain(const CheckpointStore& source,
                                                       const CheckpointStore& drain, const std::string& run,
                                                       int every_n_steps);

// Rank 0, once every rank copied its share: the temp directory renamed into place,
// the drain's state file rewritten, its other temp directories of the run removed,
// then the drain's retention (keep_last newest, 0 = all; never a step in `protect`).
// Returns the steps retention removed.
absl::StatusOr<std::vector<int64_t>> PublishDrained(const CheckpointStore& drain, const DrainJob& job,
                                                    int keep_last, const std::set<int64_t>& protect);

class Drainer {
 public:
  // `bytes_per_second` throttles this rank's copying (0: as fast as it goes).
  Drainer(const CheckpointStore* source, const CheckpointStore* drain, uint32_t dir_mode,
          int64_t bytes_per_second);
  ~Drainer();  // cancels a copy in flight and joins the thread
  Drainer(const Drainer&) = delete;
  Drainer& operator=(const Drainer&) = delete;

  // Starts copying this rank's share of `job`. False while an earlier copy still runs
  // (Cancel it and retry).
  bool Start(DrainJob job);
  // Stops a copy in flight at its next chunk; what it finished stays for a resume.
  void Cancel();

  struct Progress {
    int64_t seq = 0;  // the job last started; 0 before any
    bool running = false;
    bool done = false;  // finished, with `status`
    absl::Status status{};
    int64_t bytes = 0;  // copied so far (files a resume kept are not counted)
    double seconds = 0;
  };
  Progress Poll() const;

 private:
  void Loop();
  absl::Status Copy(const DrainJob& job);
  absl::Status CopyFile(const std::string& from, const std::string& to);
  // Sleeps as long as the bandwidth limit asks for after `more` bytes.
  void Pace(int64_t more);
  bool Cancelled() const;

  const CheckpointStore* source_;
  const CheckpointStore* drain_;
  uint32_t dir_mode_;
  int64_t bytes_per_second_;
  // The running copy's start and bytes so far; only the drain thread touches them.
  absl::Time started_{};
  int64_t copied_ = 0;

  mutable absl::Mutex mu_;
  std::optional<DrainJob> next_ ABSL_GUARDED_BY(mu_);
  Progress progress_ ABSL_GUARDED_BY(mu_);
  bool cancel_ ABSL_GUARDED_BY(mu_) = false;
  bool quit_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_STORE_DRAIN_H_
