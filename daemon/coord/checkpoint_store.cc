#include "daemon/coord/checkpoint_store.h"

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

absl::StatusOr<std::vector<int64_t>> CheckpointStore::ListSteps(const std::string& run) const {
  const std::string dir = RunDir(run);
  if (!fs_->IsDirectory(dir)) return std::vector<int64_t>();
  ASSIGN_OR_RETURN(std::vector<std::string> names, fs_->ListDir(dir));
  std::vector<int64_t> steps;
  for (const std::string& name : names) {
    int64_t step = 0;
    if (!absl::StartsWith(name, "step-") || !absl::SimpleAtoi(name.substr(5), &step)) continue;
    if (fs_->Exists(IndexPath(Prefix(JoinPath(dir, name))))) steps.push_back(step);
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

absl::StatusOr<int64_t> CheckpointStore::LatestStep(const std::string& run) const {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps(run));
  if (steps.empty()) return absl::NotFoundError(absl::StrCat("run '", run, "' has no committed checkpoint"));
  return steps.back();
}

bool CheckpointStore::IsCommitted(const std::string& run, int64_t step) const {
  return fs_->Exists(IndexPath(Prefix(StepDir(run, step))));
}

absl::Status CheckpointStore::WriteStateFile(const std::string& run) const {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps(run));
  if (steps.empty()) return absl::OkStatus();
  CheckpointState state;
  for (int64_t step : steps) state.all_model_checkpoint_paths.push_back(StepDirName(step) + "/ckpt");
  state.model_checkpoint_path = state.all_model_checkpoint_paths.back();
  return fs_->WriteFileAtomically(JoinPath(RunDir(run), "checkpoint"), FormatCheckpointState(state));
}

}  // namespace ckptd
