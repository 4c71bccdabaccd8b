// ckptctl ls: a run's committed steps, or a root's runs, from the files.
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
#include "absl/strings/str_join.h"
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

// ls of a root: its runs, each with its committed steps and newest step.
int LsRuns(const std::string& root, const std::vector<std::string>& runs, bool as_json) {
  ckptd::FileSystem* fs = ckptd::PosixFileSystem();
  const ckptd::CheckpointStore store(fs, TrimSlashes(root));
  json out = json::array();
  if (!as_json) std::printf("%-24s  %6s  %12s  %s\n", "RUN", "STEPS", "LATEST", "PATH");
  for (const std::string& run : runs) {
    const std::vector<int64_t> steps = store.ListSteps(run).value_or(std::vector<int64_t>{});
    if (steps.empty()) continue;
    if (as_json) {
      out.push_back(
          {{"run", run}, {"steps", steps.size()}, {"latest", steps.back()}, {"path", store.RunDir(run)}});
    } else {
      std::printf("%-24s  %6zu  %12lld  %s\n", run.c_str(), steps.size(),
                  static_cast<long long>(steps.back()), store.RunDir(run).c_str());
    }
  }
  if (as_json) PrintJson(out);
  return kOk;
}

int Ls(const Context& ctx, const std::string& dir, bool as_json, bool show_orphans) {
  ckptd::FileSystem* fs = ckptd::PosixFileSystem();
  auto run_dir = OpenRunDir(dir);
  if (!run_dir.ok()) return Error(run_dir.status());
  const std::string& run = run_dir->run;
  const ckptd::CheckpointStore& store = run_dir->store;
  auto steps = store.ListSteps(run);
  if (!steps.ok()) return Error(steps.status());
  if (steps->empty()) {
    // Not a run with steps: a root holding runs, or the wrong directory.
    if (const std::vector<std::string> runs = RunsWithSteps(fs, dir); !runs.empty()) {
      return LsRuns(dir, runs, as_json);
    }
    if (!fs->Exists(ckptd::JoinPath(TrimSlashes(dir), "checkpoint"))) {
      return Error(absl::NotFoundError(absl::StrCat(
          dir, " holds no committed step and no run (want a run directory <root>/<run> or a root)")));
    }
  }
  std::vector<StepRow> rows;
  for (int64_t step : *steps) {
    const std::string path = store.StepDir(run, step);
    const int64_t bytes = store.StepBytes(run, step);
    const ckptd::CheckpointMeta meta = ReadMeta(ctx, ckptd::CheckpointStore::Prefix(path));
    rows.push_back({.step = step,
                    .path = path,
                    .bytes = bytes,
                    .created_unix = static_cast<double>(meta.created_unix),
                    .commit_seconds = meta.commit_seconds});
  }
  if (!show_orphans) {
    PrintSteps(rows, as_json);
    return kOk;
  }
  auto orphans = store.RemoveOrphans(run, /*dry_run=*/true);
  if (!orphans.ok()) return Error(orphans.status());
  if (as_json) {
    json out = {{"steps", json::array()}, {"orphans", *orphans}};
    for (const StepRow& r : rows) {
      out["steps"].push_back({{"step", r.step}, {"path", r.path}, {"bytes", r.bytes}});
    }
    PrintJson(out);
    return kOk;
  }
  PrintSteps(rows, false);
  for (const std::string& path : *orphans) std::printf("%12s  %s\n", "orphan", path.c_str());
  return kOk;
}

}  // namespace ckptctl
