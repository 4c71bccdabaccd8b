// ckptctl's offline commands: they read checkpoint files through the format library
// (bundle, store) and never talk to a daemon.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/ckptctl/commands.h"
#include "client/tensor_export.h"
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

// Where checkpoint files are read from: this machine's file system, or a daemon's
// (ReadCheckpointsThrough). Output files are always this machine's.
ckptd::FileSystem* checkpoint_fs = nullptr;

ckptd::FileSystem* CheckpointFs() {
  return checkpoint_fs != nullptr ? checkpoint_fs : ckptd::PosixFileSystem();
}

using ckptd::BundleReader;

// Accepts a bundle prefix, a step directory (holding ckpt.index), a run directory
// (holding TF's `checkpoint` state file, which names the newest prefix) or a
// directory holding exactly one PREFIX.index.
std::string TrimSlashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

// A ckptd run directory <root>/<run>: its committed steps, ascending, as ls finds
// them (step-* directories holding ckpt.index); empty for any other directory.
std::vector<int64_t> CommittedSteps(ckptd::FileSystem* fs, const std::string& dir) {
  const std::string trimmed = TrimSlashes(dir);
  const ckptd::CheckpointStore store(fs, ckptd::DirName(trimmed));
  return store.ListSteps(trimmed.substr(trimmed.rfind('/') + 1)).value_or(std::vector<int64_t>{});
}

std::string StepPrefix(const std::string& run_dir, int64_t step) {
  return ckptd::CheckpointStore::Prefix(
      ckptd::JoinPath(TrimSlashes(run_dir), ckptd::CheckpointStore::StepDirName(step)));
}

absl::StatusOr<std::string> ResolvePrefix(ckptd::FileSystem* fs, const std::string& arg) {
  if (fs->Exists(ckptd::IndexPath(arg))) return arg;
  if (fs->IsDirectory(arg)) {
    const std::string in_dir = ckptd::CheckpointStore::Prefix(arg);
    if (fs->Exists(ckptd::IndexPath(in_dir))) return in_dir;
    // A ckptd run directory: its newest committed step, as ls and latest find it.
    if (const std::vector<int64_t> steps = CommittedSteps(fs, arg); !steps.empty()) {
      return StepPrefix(arg, steps.back());
    }
    const std::string state_path = ckptd::JoinPath(arg, "checkpoint");
    if (fs->Exists(state_path)) {
      auto text = fs->ReadFileToString(state_path, 1 << 20);
      if (!text.ok()) return text.status();
      auto state = ckptd::ParseCheckpointState(*text);
      if (!state.ok()) return state.status();
      const std::string& p = state->model_checkpoint_path;
      return p.empty() || p[0] == '/' ? p : ckptd::JoinPath(arg, p);
    }
    // A directory with exactly one bundle in it (a SavedModel's variables/, say).
    std::vector<std::string> prefixes;
    if (auto names = fs->ListDir(arg); names.ok()) {
      for (const std::string& n : *names) {
        if (n.size() > 6 && n.compare(n.size() - 6, 6, ".index") == 0)
          prefixes.push_back(n.substr(0, n.size() - 6));
      }
    }
    if (prefixes.size() == 1) return ckptd::JoinPath(arg, prefixes[0]);
  }
  return absl::NotFoundError(absl::StrCat(arg,
                                          ": no checkpoint here (want PREFIX with PREFIX.index, a step "
                                          "directory, or a directory with a `checkpoint` file)"));
}

absl::StatusOr<std::unique_ptr<BundleReader>> OpenCheckpoint(const std::string& arg,
                                                             std::string* prefix_out) {
  ckptd::FileSystem* fs = CheckpointFs();
  auto prefix = ResolvePrefix(fs, arg);
  if (!prefix.ok()) return prefix.status();
  if (prefix_out != nullptr) *prefix_out = *prefix;
  return BundleReader::Open(fs, *prefix);
}

// ckptd.json beside a prefix, when the checkpoint is ours (and readable); else
// defaults (a checkpoint TensorFlow wrote has none).
ckptd::CheckpointMeta ReadMeta(const std::string& prefix) {
  auto text = CheckpointFs()->ReadFileToString(
      ckptd::JoinPath(ckptd::DirName(prefix), ckptd::kCheckpointMetaFile), 1 << 28);
  if (!text.ok()) return ckptd::CheckpointMeta{};
  return ckptd::CheckpointMeta::FromJson(*text).value_or(ckptd::CheckpointMeta{});
}

// One host's part of a checkpoint saved with `storage: local`: the data files in
// this directory, and who holds the others (from ckptd.json). `elsewhere` is empty
// for a checkpoint that is whole here.
struct HostPart {
  std::set<int> here;
  std::vector<std::string> elsewhere;  // "rank 1 (host1)"

  std::string Note(const std::string& prefix) const {
    return absl::StrCat(
        ckptd::DirName(prefix), " holds ",
        here.empty() ? "no shard" : absl::StrCat("the shard of rank ", absl::StrJoin(here, ",")),
        " of this checkpoint only (saved with storage: local); ", absl::StrJoin(elsewhere, ", "), " hold",
        elsewhere.size() == 1 ? "s" : "",
        " the rest: run this on those hosts too, or read the whole checkpoint through a daemon with "
        "--address ADDRESS RUN [--step N]");
  }
};

HostPart PartHere(const std::string& prefix, const ckptd::CheckpointMeta& meta) {
  HostPart part;
  if (meta.storage != "local") return part;
  for (const ckptd::CheckpointMeta::Host& h : meta.hosts) {
    if (CheckpointFs()->Exists(ckptd::JoinPath(ckptd::DirName(prefix), h.file))) {
      part.here.insert(h.rank);
    } else {
      part.elsewhere.push_back(
          absl::StrCat("rank ", h.rank, h.host.empty() ? "" : absl::StrCat(" (", h.host, ")")));
    }
  }
  return part;
}

absl::StatusOr<std::vector<std::string>> SelectNames(const BundleReader& reader, const std::string& pattern) {
  return FilterNames(reader.TensorNames(), pattern);
}

// A run directory <root>/<run> as the store that holds it and the run's name.
struct RunDir {
  std::string run;
  ckptd::CheckpointStore store;
};

absl::StatusOr<RunDir> OpenRunDir(const std::string& dir) {
  ckptd::FileSystem* fs = ckptd::PosixFileSystem();
  const std::string trimmed = TrimSlashes(dir);
  if (!fs->IsDirectory(trimmed)) return absl::NotFoundError(absl::StrCat(dir, " is not a directory"));
  if (fs->Exists(ckptd::IndexPath(ckptd::CheckpointStore::Prefix(trimmed)))) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, " is a step directory; this command takes a run directory (<root>/<run>)"));
  }
  return RunDir{trimmed.substr(trimmed.rfind('/') + 1), ckptd::CheckpointStore(fs, ckptd::DirName(trimmed))};
}

}  // namespace

void ReadCheckpointsThrough(ckptd::FileSystem* fs) { checkpoint_fs = fs; }

// --- ls ---------------------------------------------------------------------------

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

int Ls(const std::string& dir, bool as_json, bool show_orphans) {
  ckptd::FileSystem* fs = ckptd::PosixFileSystem();
  auto run_dir = OpenRunDir(dir);
  if (!run_dir.ok()) return Error(run_dir.status());
  const std::string& run = run_dir->run;
  const ckptd::CheckpointStore& store = run_dir->store;
  auto steps = store.ListSteps(run);
  if (!steps.ok()) return Error(steps.status());
  if (steps->empty()) {
    // Not a run with steps: a root holding runs, or the wrong directory.
    const ckptd::CheckpointStore as_root(fs, TrimSlashes(dir));
    std::vector<std::string> runs;
    for (const std::string& r : as_root.ListRuns().value_or(std::vector<std::string>{})) {
      if (!as_root.ListSteps(r).value_or(std::vector<int64_t>{}).empty()) runs.push_back(r);
    }
    if (!runs.empty()) return LsRuns(dir, runs, as_json);
    if (!fs->Exists(ckptd::JoinPath(TrimSlashes(dir), "checkpoint"))) {
      return Error(absl::NotFoundError(absl::StrCat(
          dir, " holds no committed step and no run (want a run directory <root>/<run> or a root)")));
    }
  }
  std::vector<StepRow> rows;
  for (int64_t step : *steps) {
    const std::string path = store.StepDir(run, step);
    int64_t bytes = 0;
    if (auto names = fs->ListDir(path); names.ok()) {
      for (const auto& n : *names) bytes += fs->FileSize(ckptd::JoinPath(path, n)).value_or(0);
    }
    const ckptd::CheckpointMeta meta = ReadMeta(ckptd::CheckpointStore::Prefix(path));
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

// --- inspect ----------------------------------------------------------------------

int Inspect(const std::string& arg, const std::string& pattern, bool as_json) {
  std::string prefix;
  auto reader = OpenCheckpoint(arg, &prefix);
  if (!reader.ok()) return Error(reader.status());
  auto names = SelectNames(**reader, pattern);
  if (!names.ok()) return Error(names.status());
  // ckptd.json, when the checkpoint is ours, adds the mesh and each tensor's layout.
  const ckptd::CheckpointMeta meta = ReadMeta(prefix);
  const HostPart part = PartHere(prefix, meta);
  const std::string mesh = meta.mesh;
  std::map<std::string, std::string> layouts;
  for (const ckptd::CheckpointMeta::Tensor& t : meta.tensors) {
    if (!t.layout.empty()) layouts[t.name] = t.layout;
  }
  json entries = json::array();
  if (!as_json) {
    std::printf("%s: %d shard(s), %zu tensor(s)%s\n", prefix.c_str(), (*reader)->header().num_shards(),
                names->size(), pattern.empty() ? "" : absl::StrCat(" matching '", pattern, "'").c_str());
    if (!mesh.empty()) std::printf("mesh: %s\n", mesh.c_str());
    if (!part.elsewhere.empty()) std::printf("note: %s\n", part.Note(prefix).c_str());
  }
  for (const std::string& name : *names) {
    auto info = (*reader)->Lookup(name);
    if (!info.ok()) return Error(info.status());
    const ckptd::tf::BundleEntryProto& e = *(*reader)->Find(name);
    json j = {{"key", name},          {"dtype", ckptd::DataTypeName(info->dtype)},
              {"shape", info->shape}, {"shard", e.shard_id()},
              {"offset", e.offset()}, {"size", e.size()}};
    if (e.slices_size() > 0) {
      json slices = json::array();
      for (const ckptd::SavedPiece& p : info->pieces) {
        slices.push_back({{"slice", p.box.ToSliceString(info->shape)},
                          {"shard", p.entry.shard_id()},
                          {"offset", p.entry.offset()},
                          {"size", p.entry.size()}});
      }
      j["slices"] = slices;
    }
    const auto layout = layouts.find(name);
    if (layout != layouts.end()) j["layout"] = layout->second;
    if (as_json) {
      entries.push_back(j);
      continue;
    }
    int64_t bytes = 0;
    for (const ckptd::SavedPiece& p : info->pieces) bytes += p.entry.size();
    std::printf("  %-60s %-9s %-20s %12lld bytes", name.c_str(), ckptd::DataTypeName(info->dtype).c_str(),
                ShapeString(info->shape).c_str(), static_cast<long long>(bytes));
    if (e.slices_size() == 0) {
      std::printf("  shard %d\n", e.shard_id());
    } else {
      std::printf("  %zu slices\n", info->pieces.size());
    }
    if (layout != layouts.end()) std::printf("      layout %s\n", layout->second.c_str());
    if (e.slices_size() > 0) {
      for (const ckptd::SavedPiece& p : info->pieces) {
        std::printf("      slice %-28s shard %d offset %lld size %lld\n",
                    p.box.ToSliceString(info->shape).c_str(), p.entry.shard_id(),
                    static_cast<long long>(p.entry.offset()), static_cast<long long>(p.entry.size()));
      }
    }
  }
  if (as_json) {
    json out = {{"num_shards", (*reader)->header().num_shards()}, {"entries", entries}};
    if (!mesh.empty()) out["mesh"] = mesh;
    if (!part.elsewhere.empty()) out["shards_elsewhere"] = part.elsewhere;
    PrintJson(out);
  }
  return kOk;
}

// --- verify -----------------------------------------------------------------------
namespace {

// One checkpoint checked: every entry's bytes against its checksum.
struct Verified {
  std::string prefix;  // empty: no checkpoint found at all
  std::string open_problem;
  std::vector<std::string> problems;
  int64_t bytes = 0;
  int checked = 0;
  HostPart part;
  bool ok() const { return open_problem.empty() && problems.empty(); }
};

Verified VerifyPrefix(const std::string& arg, bool progress_on_tty) {
  Verified v;
  auto reader = OpenCheckpoint(arg, &v.prefix);
  if (!reader.ok()) {
    v.open_problem = std::string(reader.status().message());
    return v;
  }
  Progress progress("verify");
  // One host's part of a local-storage checkpoint: check what is here, say where the
  // rest is. A part with none of the data files is a problem, not a pass.
  v.part = PartHere(v.prefix, ReadMeta(v.prefix));
  if (!v.part.elsewhere.empty() && v.part.here.empty()) {
    v.problems.push_back(v.part.Note(v.prefix));
    return v;
  }
  v.checked = (*reader)->VerifyAll(
      &v.problems, &v.bytes,
      [&](int64_t done, int64_t total) {
        if (progress_on_tty) progress.Update(done, total);
      },
      v.part.here);
  return v;
}

json VerifiedJson(const Verified& v) {
  if (!v.open_problem.empty()) return {{"prefix", v.prefix}, {"ok", false}, {"problems", {v.open_problem}}};
  json out = {{"prefix", v.prefix},   {"ok", v.ok()},     {"complete", v.part.elsewhere.empty()},
              {"entries", v.checked}, {"bytes", v.bytes}, {"problems", v.problems}};
  if (!v.part.elsewhere.empty()) out["shards_elsewhere"] = v.part.elsewhere;
  return out;
}

void PrintVerified(const Verified& v) {
  if (!v.open_problem.empty()) {
    std::cerr << "ckptctl verify: " << v.open_problem << std::endl;
    return;
  }
  for (const std::string& line : v.problems) std::cerr << "FAIL " << line << std::endl;
  if (!v.part.elsewhere.empty() && !v.part.here.empty())
    std::printf("note: %s\n", v.part.Note(v.prefix).c_str());
  std::printf("%s: %d entries checked, %lld bytes, %zu problem(s)\n", v.prefix.c_str(), v.checked,
              static_cast<long long>(v.bytes), v.problems.size());
}

// The committed steps of a run directory, or why there are none to look at.
absl::StatusOr<std::vector<int64_t>> RunSteps(const std::string& run_dir) {
  auto dir = OpenRunDir(run_dir);
  if (!dir.ok()) return dir.status();
  const std::vector<int64_t> steps = CommittedSteps(ckptd::PosixFileSystem(), run_dir);
  if (steps.empty()) {
    return absl::NotFoundError(
        absl::StrCat(run_dir, " holds no committed step (want a run directory <root>/<run>)"));
  }
  return steps;
}

}  // namespace

int Verify(const std::string& arg, bool as_json, bool quiet) {
  const Verified v = VerifyPrefix(arg, !quiet && !as_json);
  if (v.prefix.empty()) return Error(absl::NotFoundError(v.open_problem));  // no checkpoint there at all
  if (as_json) {
    if (!v.open_problem.empty()) std::cerr << "ckptctl verify: " << v.open_problem << std::endl;
    PrintJson(VerifiedJson(v));
  } else {
    PrintVerified(v);
  }
  return v.ok() ? kOk : kFound;
}

int VerifyAll(const std::string& run_dir, bool as_json, bool quiet) {
  auto steps = RunSteps(run_dir);
  if (!steps.ok()) return Error(steps.status());
  json out = json::array();
  int failed = 0;
  for (int64_t step : *steps) {
    const Verified v = VerifyPrefix(StepPrefix(run_dir, step), !quiet && !as_json);
    failed += v.ok() ? 0 : 1;
    if (as_json) {
      json j = VerifiedJson(v);
      j["step"] = step;
      out.push_back(j);
    } else {
      PrintVerified(v);
    }
  }
  if (as_json) {
    PrintJson({{"run_dir", run_dir}, {"ok", failed == 0}, {"steps", out}});
  } else {
    std::printf("%zu step(s) verified, %d with problems\n", steps->size(), failed);
  }
  return failed == 0 ? kOk : kFound;
}

int Latest(const std::string& run_dir, bool verified, bool as_json) {
  auto steps = RunSteps(run_dir);
  if (!steps.ok()) return Error(steps.status());
  std::vector<std::pair<int64_t, std::string>> prefixes;
  for (int64_t step : *steps) prefixes.emplace_back(step, StepPrefix(run_dir, step));
  return Latest(prefixes, run_dir, verified, as_json);
}

int Latest(const std::vector<std::pair<int64_t, std::string>>& steps, const std::string& what, bool verified,
           bool as_json) {
  if (steps.empty()) return Error(absl::NotFoundError(absl::StrCat(what, " has no committed step")));
  json skipped = json::array();
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const auto& [step, prefix] = *it;
    if (verified) {
      const Verified v = VerifyPrefix(prefix, false);
      if (!v.ok()) {
        const std::string why = v.open_problem.empty() ? v.problems.front() : v.open_problem;
        skipped.push_back({{"step", step}, {"problem", why}});
        if (!as_json)
          std::fprintf(stderr, "skipped step %lld: %s\n", static_cast<long long>(step), why.c_str());
        continue;
      }
    }
    if (as_json) {
      PrintJson({{"step", step},
                 {"path", ckptd::DirName(prefix)},
                 {"prefix", prefix},
                 {"verified", verified},
                 {"skipped", skipped}});
    } else {
      std::printf("%lld %s\n", static_cast<long long>(step), ckptd::DirName(prefix).c_str());
    }
    return kOk;
  }
  if (as_json) PrintJson({{"step", nullptr}, {"verified", verified}, {"skipped", skipped}});
  std::cerr << "ckptctl latest: no step of " << what << " verifies" << std::endl;
  return kFound;
}

std::string StepOf(const std::string& run_dir, int64_t step) { return StepPrefix(run_dir, step); }

// --- export -----------------------------------------------------------------------

// A whole tensor's bytes, assembled from its slices; bfloat16 widened to float32
// when `widen_bfloat16` (NumPy has no bfloat16).
absl::Status ReadWhole(BundleReader& reader, const ckptd::TensorInfo& info, bool widen_bfloat16,
                       std::string* out) {
  const ckptd::Box full = ckptd::Box::Full(info.shape);
  const size_t count = static_cast<size_t>(full.NumElements());
  out->resize(count * ckptd::DataTypeSize(info.dtype));
  RETURN_IF_ERROR(reader.ReadBox(info, full, out->data()));
  if (widen_bfloat16 && info.dtype == ckptd::kBfloat16) {
    std::string wide(count * 4, '\0');
    RETURN_IF_ERROR(ckptd::ConvertElements(ckptd::kBfloat16, out->data(), ckptd::kFloat, wide.data(), count));
    out->swap(wide);
  }
  return absl::OkStatus();
}

int Export(const std::string& arg, const std::string& format, const std::string& out_dir,
           const std::string& pattern, bool as_json) {
  ckptd::FileSystem* fs = ckptd::PosixFileSystem();
  std::string prefix;
  auto reader = OpenCheckpoint(arg, &prefix);
  if (!reader.ok()) return Error(reader.status());
  if (const HostPart part = PartHere(prefix, ReadMeta(prefix)); !part.elsewhere.empty()) {
    return Error(
        absl::FailedPreconditionError(absl::StrCat("cannot export whole tensors: ", part.Note(prefix))));
  }
  auto names = SelectNames(**reader, pattern);
  if (!names.ok()) return Error(names.status());
  if (absl::Status s = (*reader)->OpenAllDataFiles(); !s.ok()) return Error(s);
  if (absl::Status s = fs->CreateDirs(out_dir, 0755); !s.ok()) return Error(s);
  std::vector<ckptd::TensorInfo> infos;
  json skipped = json::array();
  for (const std::string& name : *names) {
    auto info = (*reader)->Lookup(name);
    if (!info.ok()) return Error(info.status());
    const bool exportable = format == "npy"
                                ? info->dtype == ckptd::kBfloat16 || ckptd::NpyHeader(info->dtype, {}).ok()
                                : ckptd::SafetensorsDtype(info->dtype).ok();
    if (!exportable) {
      skipped.push_back({{"name", name}, {"dtype", ckptd::DataTypeName(info->dtype)}});
      if (!as_json)
        std::fprintf(stderr, "skipped %s: %s has no %s dtype\n", name.c_str(),
                     ckptd::DataTypeName(info->dtype).c_str(), format.c_str());
      continue;
    }
    for (const ckptd::SavedPiece& p : info->pieces) {
      if (absl::Status s = (*reader)->CheckEntryRange(name, p.entry); !s.ok()) return Error(s);
    }
    infos.push_back(std::move(*info));
  }
  json files = json::array();
  int64_t total = 0;
  std::string bytes;
  if (format == "npy") {
    for (const ckptd::TensorInfo& info : infos) {
      if (absl::Status s = ReadWhole(**reader, info, /*widen_bfloat16=*/true, &bytes); !s.ok())
        return Error(s);
      const std::string path = ckptd::JoinPath(out_dir, ckptd::TensorFileName(info.name) + ".npy");
      const int dtype = info.dtype == ckptd::kBfloat16 ? ckptd::kFloat : info.dtype;
      absl::Status s = fs->CreateDirs(ckptd::DirName(path), 0755);
      if (s.ok()) s = ckptd::WriteNpy(fs, path, dtype, info.shape, bytes);
      if (!s.ok()) return Error(s);
      total += static_cast<int64_t>(bytes.size());
      files.push_back({{"name", info.name}, {"path", path}, {"dtype", ckptd::DataTypeName(dtype)}});
      if (!as_json) std::printf("%s -> %s\n", info.name.c_str(), path.c_str());
    }
  } else {
    std::vector<ckptd::ExportTensor> tensors;
    for (const ckptd::TensorInfo& info : infos) tensors.push_back({info.name, info.dtype, info.shape});
    const std::string path = ckptd::JoinPath(out_dir, "model.safetensors");
    const ckptd::CheckpointMeta meta = ReadMeta(prefix);
    std::vector<std::pair<std::string, std::string>> metadata = {{"format", "pt"}, {"source", prefix}};
    if (!meta.run.empty()) metadata.emplace_back("step", std::to_string(meta.step));
    absl::Status s = ckptd::WriteSafetensors(fs, path, tensors, metadata, [&](size_t i, std::string* out) {
      total += ckptd::Box::Full(infos[i].shape).NumElements() * ckptd::DataTypeSize(infos[i].dtype);
      return ReadWhole(**reader, infos[i], /*widen_bfloat16=*/false, out);
    });
    if (!s.ok()) return Error(s);
    files.push_back({{"path", path}, {"tensors", tensors.size()}});
    if (!as_json) std::printf("%zu tensor(s) -> %s\n", tensors.size(), path.c_str());
  }
  if (as_json) {
    PrintJson(
        {{"prefix", prefix}, {"format", format}, {"files", files}, {"bytes", total}, {"skipped", skipped}});
  } else {
    std::printf("exported %zu tensor(s), %s, as %s into %s\n", infos.size(), HumanBytes(total).c_str(),
                format.c_str(), out_dir.c_str());
  }
  return kOk;
}

// --- diff -------------------------------------------------------------------------

// crc32c of a tensor's bytes as saved: the entry's own checksum when it is stored
// whole, else the checksum of the assembled tensor (slicing may differ between the
// two checkpoints; the bytes are what count).
absl::StatusOr<uint32_t> ContentChecksum(BundleReader& reader, const ckptd::TensorInfo& info) {
  const ckptd::tf::BundleEntryProto& e = *reader.Find(info.name);
  if (e.slices_size() == 0 && info.dtype != ckptd::kString) return e.crc32c();
  std::string bytes;
  if (info.dtype == ckptd::kString) {
    bytes.resize(static_cast<size_t>(e.size()));
    RETURN_IF_ERROR(reader.CheckEntryRange(info.pieces[0].label, e));
    RETURN_IF_ERROR(reader.ReadEntry(info.pieces[0].label, e, bytes.data()));
  } else {
    RETURN_IF_ERROR(ReadWhole(reader, info, false, &bytes));
  }
  return ckptd::crc32c::Value(bytes.data(), bytes.size());
}

int Diff(const std::string& a_arg, const std::string& b_arg, const std::string& pattern, bool as_json) {
  std::string a_prefix, b_prefix;
  auto a = OpenCheckpoint(a_arg, &a_prefix);
  if (!a.ok()) return Error(a.status());
  auto b = OpenCheckpoint(b_arg, &b_prefix);
  if (!b.ok()) return Error(b.status());
  for (const std::string& prefix : {a_prefix, b_prefix}) {
    if (const HostPart part = PartHere(prefix, ReadMeta(prefix)); !part.elsewhere.empty()) {
      return Error(
          absl::FailedPreconditionError(absl::StrCat("cannot compare contents: ", part.Note(prefix))));
    }
  }
  auto a_names = SelectNames(**a, pattern);
  auto b_names = SelectNames(**b, pattern);
  if (!a_names.ok()) return Error(a_names.status());
  if (!b_names.ok()) return Error(b_names.status());
  const std::set<std::string> in_a(a_names->begin(), a_names->end()), in_b(b_names->begin(), b_names->end());
  json added = json::array(), removed = json::array(), changed = json::array();
  int same = 0;
  std::set<std::string> all = in_a;
  all.insert(in_b.begin(), in_b.end());
  for (const std::string& name : all) {
    if (in_a.count(name) == 0) {
      added.push_back(name);
      continue;
    }
    if (in_b.count(name) == 0) {
      removed.push_back(name);
      continue;
    }
    auto ia = (*a)->Lookup(name);
    auto ib = (*b)->Lookup(name);
    if (!ia.ok()) return Error(ia.status());
    if (!ib.ok()) return Error(ib.status());
    std::string why;
    if (ia->dtype != ib->dtype) {
      why = absl::StrCat("dtype ", ckptd::DataTypeName(ia->dtype), " -> ", ckptd::DataTypeName(ib->dtype));
    } else if (ia->shape != ib->shape) {
      why = absl::StrCat("shape ", ShapeString(ia->shape), " -> ", ShapeString(ib->shape));
    } else {
      auto ca = ContentChecksum(**a, *ia);
      auto cb = ContentChecksum(**b, *ib);
      if (!ca.ok()) return Error(ca.status());
      if (!cb.ok()) return Error(cb.status());
      if (*ca != *cb) why = absl::StrFormat("content (crc32c %08x -> %08x)", *ca, *cb);
    }
    if (why.empty()) {
      ++same;
    } else {
      changed.push_back({{"name", name}, {"change", why}});
    }
  }
  const bool differ = !added.empty() || !removed.empty() || !changed.empty();
  if (as_json) {
    PrintJson({{"a", a_prefix},
               {"b", b_prefix},
               {"added", added},
               {"removed", removed},
               {"changed", changed},
               {"unchanged", same}});
  } else {
    for (const auto& n : added) std::printf("+ %s\n", n.get<std::string>().c_str());
    for (const auto& n : removed) std::printf("- %s\n", n.get<std::string>().c_str());
    for (const auto& c : changed) {
      std::printf("~ %s: %s\n", c["name"].get<std::string>().c_str(), c["change"].get<std::string>().c_str());
    }
    std::printf("%zu added, %zu removed, %zu changed, %d unchanged\n", added.size(), removed.size(),
                changed.size(), same);
  }
  return differ ? kFound : kOk;
}

// --- gc ---------------------------------------------------------------------------

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

int Gc(const std::string& dir, int keep_last, int keep_every, bool dry_run, bool as_json) {
  auto run_dir = OpenRunDir(dir);
  if (!run_dir.ok()) return Error(run_dir.status());
  const std::string& run = run_dir->run;
  const ckptd::CheckpointStore& store = run_dir->store;
  // What a crash left (temp and half-deleted step directories): removed unless a
  // daemon runs on this root, whose next commit removes them itself.
  const std::string daemon_lock = RunningDaemonLock(dir);
  auto orphans = store.RemoveOrphans(run, /*dry_run=*/dry_run || !daemon_lock.empty());
  if (!orphans.ok()) return Error(orphans.status());
  auto removed = store.ApplyRetention(run, keep_last, keep_every, {}, dry_run);
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
