// ckptctl gc: retention and what a crash left, applied to a run directory.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/ckptctl/commands.h"
#include "client/ckptctl/offline_common.h"
#include "client/tensor_export.h"
#include "client/tensor_values.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/bundle/checkpoint_meta.h"
#include "daemon/bundle/crc32c.h"
#include "daemon/io/private_dir.h"
#include "daemon/layout/cast.h"
#include "daemon/store/checkpoint_store.h"

namespace ckptctl {

namespace {

// A daemon running on the root of `run_dir` (it holds a .ckptd-rank-N.lock there):
// the lock's path, else empty. Its temp directories may be a commit in flight.
std::string RunningDaemonLock(const std::string& run_dir) {
  const std::string root = ckptd::DirName(TrimSlashes(run_dir));
  ckptd::FileSystem* fs = ckptd::PosixFileSystem();
  for (const std::string& name : fs->ListDir(root).value_or(std::vector<std::string>{})) {
    if (!absl::StartsWith(name, ".ckptd-rank-") || !absl::EndsWith(name, ".lock")) continue;
    const std::string path = ckptd::JoinPath(root, name);
    if (!ckptd::ProcessLock::Acquire(path, "ckptctl gc").ok()) return path;
  }
  return "";
}

}  // namespace

int Gc(const std::string& dir, int keep_last, int keep_every, bool dry_run, bool quiet, bool as_json) {
  auto run_dir = OpenRunDir(dir);
  if (!run_dir.ok()) return Error(run_dir.status());
  // A root is not a run: retention across every run is not what one run's gc means.
  if (absl::Status s = RefuseRoot(ckptd::PosixFileSystem(), dir, "gc takes one run directory"); !s.ok()) {
    return Error(s);
  }
  const std::string& run = run_dir->run;
  // The state file gc rewrites is as private as the daemon's.
  const std::unique_ptr<ckptd::FileSystem> writer =
      ckptd::PosixFileSystemCreating(ckptd::ModesBeneath(dir, /*private_at_least=*/true).file);
  const ckptd::CheckpointStore store(writer.get(), run_dir->store.root());
  // What a crash left (temp and half-deleted step directories): removed unless a
  // daemon runs on this root, whose next commit removes them itself.
  const std::string daemon_lock = RunningDaemonLock(dir);
  auto orphans = store.RemoveOrphans(run, /*dry_run=*/dry_run || !daemon_lock.empty());
  if (!orphans.ok()) return Error(orphans.status());
  Progress progress("gc", "steps");
  auto removed =
      store.ApplyRetention(run, keep_last, keep_every, {}, dry_run, [&](size_t done, size_t total) {
        if (!quiet && !as_json) progress.Update(static_cast<int64_t>(done), static_cast<int64_t>(total));
      });
  if (!removed.ok()) return Error(removed.status());
  auto listed = store.ListSteps(run);
  if (!listed.ok()) return Error(listed.status());
  std::vector<int64_t> kept;
  for (int64_t step : *listed) {
    if (!dry_run || std::find(removed->begin(), removed->end(), step) == removed->end()) kept.push_back(step);
  }
  const bool orphans_left = !daemon_lock.empty() && !orphans->empty();
  if (as_json) {
    json out = {{"dry_run", dry_run}, {"removed", *removed}, {"kept", kept}, {"orphans", *orphans}};
    if (orphans_left) out["orphans_left_to_daemon"] = daemon_lock;
    PrintJson(out);
    return kOk;
  }
  for (const std::string& path : *orphans) {
    std::printf("%s orphan %s\n", dry_run ? "would remove" : orphans_left ? "left" : "removed", path.c_str());
  }
  if (orphans_left) {
    std::printf("a daemon runs on this root (it holds %s): it removes orphans at its next commit\n",
                daemon_lock.c_str());
  }
  for (int64_t step : *removed) {
    std::printf("%s step %lld\n", dry_run ? "would remove" : "removed", static_cast<long long>(step));
  }
  std::printf("%zu step(s) %s, %zu kept\n", removed->size(), dry_run ? "would be removed" : "removed",
              kept.size());
  return kOk;
}

}  // namespace ckptctl
