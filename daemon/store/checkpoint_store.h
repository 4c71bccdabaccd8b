// CheckpointStore: where checkpoints live under the root and what is committed.
// <root>/<run>/step-NNNNNNNN/ckpt.{index,data-*}, ckptd.json; temp directories are
// <root>/<run>/.tmp-step-NNNNNNNN and never count as committed. Stateless apart from
// the root; thread-safe as its FileSystem is.
#ifndef CKPTD_DAEMON_STORE_CHECKPOINT_STORE_H_
#define CKPTD_DAEMON_STORE_CHECKPOINT_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/io/file_system.h"

namespace ckptd {

class CheckpointStore {
 public:
  CheckpointStore(FileSystem* fs, std::string root) : fs_(fs), root_(std::move(root)) {}

  FileSystem* fs() const { return fs_; }
  const std::string& root() const { return root_; }
  std::string RunDir(const std::string& run) const;
  std::string StepDir(const std::string& run, int64_t step) const;
  std::string TempDir(const std::string& run, int64_t step) const;
  static std::string StepDirName(int64_t step);
  // The bundle prefix inside a step (or temp) directory.
  static std::string Prefix(const std::string& step_dir) { return JoinPath(step_dir, "ckpt"); }

  // Bytes of the files in a step's directory (0 for any it cannot size).
  int64_t StepBytes(const std::string& run, int64_t step) const;
  // Committed steps of a run, ascending: step-* directories holding ckpt.index.
  absl::StatusOr<std::vector<int64_t>> ListSteps(const std::string& run) const;
  absl::StatusOr<std::vector<std::string>> ListRuns() const;
  // NOT_FOUND when the run has no committed step.
  absl::StatusOr<int64_t> LatestStep(const std::string& run) const;
  // The newest committed step of every run that has one.
  absl::StatusOr<std::map<std::string, int64_t>> LatestSteps() const;
  // Whether the step is committed. An error reading the file system is an error,
  // never "no": a transient stat failure must not make a committed step look torn
  // (cleanup would delete it) or missing (the state file would forget it).
  absl::StatusOr<bool> Committed(const std::string& run, int64_t step) const;
  // Committed(), with an error read as false: only for refusals that a later check
  // repeats (a Save of a step already committed).
  bool IsCommitted(const std::string& run, int64_t step) const;
  // The steps a restore tries, in order: `step` if given (NOT_FOUND if it is not
  // committed), else the newest committed step, followed with `fallback` by every
  // older one (the caller moves on when reading one fails verification). NOT_FOUND
  // when the run has no committed step.
  absl::StatusOr<std::vector<int64_t>> RestoreCandidates(const std::string& run, std::optional<int64_t> step,
                                                         bool fallback) const;
  // Every writer of a step (the commit, the drain, ckptctl import) fills a temp
  // directory of the run, then publishes it with one rename: a reader sees all of a
  // step or none of it.
  //
  // How a writer begins: kFresh removes what an earlier attempt left and creates the
  // directory anew (one writer); kJoin creates it where missing (several hosts fill
  // one temp directory of a shared root).
  enum class Begin { kFresh, kJoin };
  // The run's temp directory for `step` with `suffix` appended (the commit: none; an
  // import or a drain, their own, so that what a crash leaves looks to cleanup like a
  // crashed commit's), created with `dir_mode`, and the run directory with it.
  absl::StatusOr<std::string> BeginStep(const std::string& run, int64_t step, absl::string_view suffix,
                                        uint32_t dir_mode, Begin how) const;
  // Publishes `temp_dir` as committed `step` of `run`: with `sync_contents` its
  // entries are made durable first; one rename makes the step visible, the run
  // directory's sync makes that durable, and only then does TF's state file name it.
  // *renamed says whether the step became visible, so that on an error the caller
  // either takes it back (renamed) or removes the temp directory.
  absl::Status PublishStep(const std::string& temp_dir, const std::string& run, int64_t step,
                           bool sync_contents, bool* renamed) const;

  // Rewrites TF's `checkpoint` state file for the run from what is committed.
  // `leaving`: a step about to be taken back, left out so that the state file never
  // names a step that is not there, whenever a crash stops the take-back.
  absl::Status WriteStateFile(const std::string& run, std::optional<int64_t> leaving = std::nullopt) const;

  // Lost steps: a step taken back because no host holds some of its data files any
  // more (local storage) leaves a note, <root>/<run>/.lost-step-NNNNNNNN holding why,
  // so that a restore of it is DATA_LOSS naming what is missing rather than NOT_FOUND
  // (or, for the newest step, an older step silently). A commit of the same step
  // number clears it.
  absl::Status MarkLost(const std::string& run, int64_t step, const std::string& why) const;
  absl::Status ClearLost(const std::string& run, int64_t step) const;
  // Lost steps of the run and why, ascending; empty when there are none.
  absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> LostSteps(const std::string& run) const;

  // Removes what a crash can leave in a run directory: temp step directories and a
  // half-written state file. Only call when no commit of the run is in flight.
  // Returns the paths removed, or with dry_run the paths it would remove.
  absl::StatusOr<std::vector<std::string>> RemoveOrphans(const std::string& run, bool dry_run = false) const;

  // Keeps the newest `keep_last` committed steps (0: all), every step divisible by
  // `keep_every_n_steps` (0: none extra), the newest step always, and `protect`;
  // removes the others (state file first, then directories). Returns the steps
  // removed, or that would be with dry_run. `deleted(done, total)`, when set, is
  // called after each step's directory is gone.
  absl::StatusOr<std::vector<int64_t>> ApplyRetention(
      const std::string& run, int keep_last, int keep_every_n_steps, const std::set<int64_t>& protect,
      bool dry_run, const std::function<void(size_t, size_t)>& deleted = nullptr) const;

 private:
  // Whether step_dir holds an index; errors other than NOT_FOUND are returned.
  absl::StatusOr<bool> HasIndex(const std::string& step_dir) const;
  std::string LostNote(const std::string& run, int64_t step) const;

  FileSystem* fs_;
  std::string root_;
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_STORE_CHECKPOINT_STORE_H_
