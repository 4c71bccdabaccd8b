#include "daemon/store/checkpoint_store.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"

namespace ckptd {

std::string CheckpointStore::StepDirName(int64_t step) {
  char name[40];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return name;
}

std::string CheckpointStore::RunDir(const std::string& run) const { return JoinPath(root_, run); }

std::string CheckpointStore::StepDir(const std::string& run, int64_t step) const {
  return JoinPath(RunDir(run), StepDirName(step));
}

std::string CheckpointStore::TempDir(const std::string& run, int64_t step) const {
  return JoinPath(RunDir(run), ".tmp-" + StepDirName(step));
}

namespace {

// kJoin: another host may have made the directory first.
absl::Status CreateDirIfMissing(FileSystem* fs, const std::string& path, uint32_t mode) {
  const absl::Status s = fs->CreateDir(path, mode);
  return absl::IsAlreadyExists(s) && fs->IsDirectory(path) ? absl::OkStatus() : s;
}

}  // namespace

absl::StatusOr<std::string> CheckpointStore::BeginStep(const std::string& run, int64_t step,
                                                       absl::string_view suffix, uint32_t dir_mode,
                                                       Begin how) const {
  const std::string temp_dir = absl::StrCat(TempDir(run, step), suffix);
  if (how == Begin::kJoin) {
    RETURN_IF_ERROR(CreateDirIfMissing(fs_, RunDir(run), dir_mode));
    RETURN_IF_ERROR(CreateDirIfMissing(fs_, temp_dir, dir_mode));
    return temp_dir;
  }
  if (absl::Status s = fs_->DeleteRecursively(temp_dir); !s.ok() && !absl::IsNotFound(s)) return s;
  RETURN_IF_ERROR(fs_->CreateDirs(temp_dir, dir_mode));
  return temp_dir;
}

absl::Status CheckpointStore::PublishStep(const std::string& temp_dir, const std::string& run, int64_t step,
                                          bool sync_contents, bool* renamed) const {
  *renamed = false;
  if (sync_contents) RETURN_IF_ERROR(fs_->SyncDir(temp_dir));
  RETURN_IF_ERROR(fs_->Rename(temp_dir, StepDir(run, step)));
  *renamed = true;
  RETURN_IF_ERROR(fs_->SyncDir(RunDir(run)));
  return WriteStateFile(run);
}

int64_t CheckpointStore::StepBytes(const std::string& run, int64_t step) const {
  const std::string dir = StepDir(run, step);
  int64_t bytes = 0;
  if (auto names = fs_->ListDir(dir); names.ok()) {
    for (const std::string& name : *names) {
      if (auto size = fs_->FileSize(JoinPath(dir, name)); size.ok()) bytes += static_cast<int64_t>(*size);
    }
  }
  return bytes;
}

absl::StatusOr<bool> CheckpointStore::HasIndex(const std::string& step_dir) const {
  absl::StatusOr<uint64_t> size = fs_->FileSize(IndexPath(Prefix(step_dir)));
  if (size.ok()) return true;
  if (absl::IsNotFound(size.status())) return false;
  return size.status();
}

absl::StatusOr<std::vector<int64_t>> CheckpointStore::ListSteps(const std::string& run) const {
  const std::string dir = RunDir(run);
  absl::StatusOr<std::vector<std::string>> names = fs_->ListDir(dir);
  if (absl::IsNotFound(names.status())) return std::vector<int64_t>();
  RETURN_IF_ERROR(names.status());
  std::vector<int64_t> steps;
  for (const std::string& name : *names) {
    int64_t step = 0;
    if (!absl::StartsWith(name, "step-") || !absl::SimpleAtoi(name.substr(5), &step)) continue;
    ASSIGN_OR_RETURN(bool committed, HasIndex(JoinPath(dir, name)));
    if (committed) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::StatusOr<std::vector<std::string>> CheckpointStore::ListRuns() const {
  if (!fs_->IsDirectory(root_)) return std::vector<std::string>();
  ASSIGN_OR_RETURN(std::vector<std::string> names, fs_->ListDir(root_));
  std::vector<std::string> runs;
  for (const std::string& name : names) {
    if (!absl::StartsWith(name, ".") && fs_->IsDirectory(JoinPath(root_, name))) runs.push_back(name);
  }
  std::sort(runs.begin(), runs.end());
  return runs;
}

absl::StatusOr<std::map<std::string, int64_t>> CheckpointStore::LatestSteps() const {
  ASSIGN_OR_RETURN(std::vector<std::string> runs, ListRuns());
  std::map<std::string, int64_t> latest;
  for (const std::string& run : runs) {
    ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps(run));
    if (!steps.empty()) latest[run] = steps.back();
  }
  return latest;
}

absl::StatusOr<int64_t> CheckpointStore::LatestStep(const std::string& run) const {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps(run));
  if (steps.empty()) return absl::NotFoundError(absl::StrCat("run '", run, "' has no committed checkpoint"));
  return steps.back();
}

absl::StatusOr<bool> CheckpointStore::Committed(const std::string& run, int64_t step) const {
  return HasIndex(StepDir(run, step));
}

bool CheckpointStore::IsCommitted(const std::string& run, int64_t step) const {
  return Committed(run, step).value_or(false);
}

absl::StatusOr<std::vector<int64_t>> CheckpointStore::RestoreCandidates(const std::string& run,
                                                                        std::optional<int64_t> step,
                                                                        bool fallback) const {
  if (step.has_value()) {
    ASSIGN_OR_RETURN(bool committed, Committed(run, *step));
    if (!committed) return absl::NotFoundError(absl::StrCat("run '", run, "' has no committed step ", *step));
    return std::vector<int64_t>{*step};
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps(run));
  if (steps.empty()) return absl::NotFoundError(absl::StrCat("run '", run, "' has no committed checkpoint"));
  std::reverse(steps.begin(), steps.end());
  if (!fallback) steps.resize(1);
  return steps;
}

std::string CheckpointStore::LostNote(const std::string& run, int64_t step) const {
  return JoinPath(RunDir(run), ".lost-" + StepDirName(step));
}

absl::Status CheckpointStore::MarkLost(const std::string& run, int64_t step, const std::string& why) const {
  RETURN_IF_ERROR(fs_->CreateDirs(RunDir(run), 0700));
  return fs_->WriteFileAtomically(LostNote(run, step), why);
}

absl::Status CheckpointStore::ClearLost(const std::string& run, int64_t step) const {
  const absl::Status s = fs_->DeleteFile(LostNote(run, step));
  return absl::IsNotFound(s) ? absl::OkStatus() : s;
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> CheckpointStore::LostSteps(
    const std::string& run) const {
  std::vector<std::pair<int64_t, std::string>> lost;
  absl::StatusOr<std::vector<std::string>> names = fs_->ListDir(RunDir(run));
  if (absl::IsNotFound(names.status())) return lost;
  RETURN_IF_ERROR(names.status());
  for (const std::string& name : *names) {
    int64_t step = 0;
    if (!absl::StartsWith(name, ".lost-step-") || !absl::SimpleAtoi(name.substr(11), &step)) continue;
    ASSIGN_OR_RETURN(std::string why, fs_->ReadFileToString(JoinPath(RunDir(run), name), 1 << 16));
    lost.emplace_back(step, std::move(why));
  }
  std::sort(lost.begin(), lost.end());
  return lost;
}

absl::StatusOr<std::vector<std::string>> CheckpointStore::RemoveOrphans(const std::string& run,
                                                                        bool dry_run) const {
  std::vector<std::string> removed;
  const std::string dir = RunDir(run);
  absl::StatusOr<std::vector<std::string>> listed = fs_->ListDir(dir);
  if (absl::IsNotFound(listed.status())) return removed;
  RETURN_IF_ERROR(listed.status());
  std::vector<std::string> names = std::move(*listed);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const bool temp_step = absl::StartsWith(name, ".tmp-step-") || absl::StartsWith(name, ".deleted-step-");
    // A step directory without an index never finished publishing.
    bool torn_step = false;
    if (absl::StartsWith(name, "step-")) {
      ASSIGN_OR_RETURN(bool has_index, HasIndex(JoinPath(dir, name)));
      torn_step = !has_index;
    }
    if (!temp_step && !torn_step && name != "checkpoint.tmp") continue;
    if (!dry_run) RETURN_IF_ERROR(fs_->DeleteRecursively(JoinPath(dir, name)));
    removed.push_back(JoinPath(dir, name));
  }
  if (!removed.empty() && !dry_run) RETURN_IF_ERROR(fs_->SyncDir(dir));
  return removed;
}

absl::StatusOr<std::vector<int64_t>> CheckpointStore::ApplyRetention(
    const std::string& run, int keep_last, int keep_every_n_steps, const std::set<int64_t>& protect,
    bool dry_run, const std::function<void(size_t, size_t)>& deleted) const {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps(run));
  std::vector<int64_t> removed;
  if (steps.empty() || keep_last <= 0) return removed;
  std::set<int64_t> keep(protect.begin(), protect.end());
  keep.insert(steps.back());
  for (size_t i = steps.size() > static_cast<size_t>(keep_last) ? steps.size() - keep_last : 0;
       i < steps.size(); ++i) {
    keep.insert(steps[i]);
  }
  for (int64_t step : steps) {
    if (keep_every_n_steps > 0 && step % keep_every_n_steps == 0) keep.insert(step);
    if (keep.count(step) == 0) removed.push_back(step);
  }
  if (dry_run || removed.empty()) return removed;
  // Hide each step with one rename (readers never see half a step), then let TF's
  // state file forget them, then free the space.
  std::vector<std::string> hidden;
  for (int64_t step : removed) {
    const std::string gone = JoinPath(RunDir(run), ".deleted-" + StepDirName(step));
    RETURN_IF_ERROR(fs_->Rename(StepDir(run, step), gone));
    hidden.push_back(gone);
  }
  RETURN_IF_ERROR(fs_->SyncDir(RunDir(run)));
  RETURN_IF_ERROR(WriteStateFile(run));
  for (size_t i = 0; i < hidden.size(); ++i) {
    RETURN_IF_ERROR(fs_->DeleteRecursively(hidden[i]));
    if (deleted) deleted(i + 1, hidden.size());
  }
  return removed;
}

absl::Status CheckpointStore::WriteStateFile(const std::string& run, std::optional<int64_t> leaving) const {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps(run));
  if (leaving.has_value()) steps.erase(std::remove(steps.begin(), steps.end(), *leaving), steps.end());
  if (steps.empty()) {
    // Nothing committed: TF must not find a state file naming a step that is gone.
    const std::string path = JoinPath(RunDir(run), "checkpoint");
    absl::Status deleted = fs_->DeleteFile(path);
    if (absl::IsNotFound(deleted)) return absl::OkStatus();
    RETURN_IF_ERROR(deleted);
    return fs_->SyncDir(RunDir(run));
  }
  CheckpointState state;
  for (int64_t step : steps) state.all_model_checkpoint_paths.push_back(StepDirName(step) + "/ckpt");
  state.model_checkpoint_path = state.all_model_checkpoint_paths.back();
  return fs_->WriteFileAtomically(JoinPath(RunDir(run), "checkpoint"), FormatCheckpointState(state));
}

}  // namespace ckptd
