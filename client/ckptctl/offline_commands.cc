// ckptctl's offline commands: they read checkpoint files through the format library
// (bundle, store) and never talk to a daemon.
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

// The runs under a checkpoint root that have at least one committed step, by name.
std::vector<std::string> RunsWithSteps(ckptd::FileSystem* fs, const std::string& root) {
  const ckptd::CheckpointStore store(fs, TrimSlashes(root));
  std::vector<std::string> runs;
  for (const std::string& r : store.ListRuns().value_or(std::vector<std::string>{})) {
    if (!store.ListSteps(r).value_or(std::vector<int64_t>{}).empty()) runs.push_back(r);
  }
  return runs;
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
    // A root of runs: which checkpoint is meant is the user's choice, not ours.
    if (const std::vector<std::string> runs = RunsWithSteps(fs, arg); !runs.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          arg, " is a checkpoint root with run(s) ", absl::StrJoin(runs, ", "), ": name a run (e.g. ",
          ckptd::JoinPath(TrimSlashes(arg), runs[0]), ") or one of its steps"));
    }
  }
  return absl::NotFoundError(absl::StrCat(arg,
                                          ": no checkpoint here (want PREFIX with PREFIX.index, a step "
                                          "directory, or a directory with a `checkpoint` file)"));
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

absl::StatusOr<std::unique_ptr<BundleReader>> OpenCheckpoint(const std::string& arg,
                                                             std::string* prefix_out) {
  ckptd::FileSystem* fs = CheckpointFs();
  auto prefix = ResolvePrefix(fs, arg);
  if (!prefix.ok()) return prefix.status();
  if (prefix_out != nullptr) *prefix_out = *prefix;
  return BundleReader::Open(fs, *prefix);
}

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

// --- reading values ---------------------------------------------------------------
namespace {

// Chunks of whole rows (along dimension 0) keep a huge tensor's read bounded.
constexpr int64_t kChunkBytes = 64 << 20;

// The boxes of consecutive runs of whole rows of a tensor of `shape`, each about
// kChunkBytes or one row, in row-major order; a scalar or a tensor without rows is
// one box.
std::vector<ckptd::Box> RowChunks(const ckptd::Shape& shape, int dtype) {
  const ckptd::Box full = ckptd::Box::Full(shape);
  if (shape.empty() || shape[0] == 0) return {full};
  const int64_t row_bytes = full.NumElements() / shape[0] * ckptd::DataTypeSize(dtype);
  const int64_t rows_per_chunk = std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(1, row_bytes));
  std::vector<ckptd::Box> chunks;
  for (int64_t row = 0; row < shape[0]; row += rows_per_chunk) {
    ckptd::Box box = full;
    box.start[0] = row;
    box.length[0] = std::min(rows_per_chunk, shape[0] - row);
    chunks.push_back(std::move(box));
  }
  return chunks;
}

// Calls fn(bytes) for each of RowChunks of tensor `info`, assembled from whatever
// slices were saved.
absl::Status ForEachChunk(BundleReader& reader, const ckptd::TensorInfo& info,
                          const std::function<absl::Status(const std::string&)>& fn) {
  RETURN_IF_ERROR(reader.CheckBoxReadable(info, ckptd::Box::Full(info.shape)));
  std::string bytes;
  for (const ckptd::Box& box : RowChunks(info.shape, info.dtype)) {
    bytes.resize(static_cast<size_t>(box.NumElements() * ckptd::DataTypeSize(info.dtype)));
    RETURN_IF_ERROR(reader.ReadBox(info, box, bytes.data()));
    RETURN_IF_ERROR(fn(bytes));
  }
  return absl::OkStatus();
}

// The bytes of one stored entry, range-checked first and checksummed as read.
absl::StatusOr<std::string> ReadEntryBytes(BundleReader& reader, const ckptd::SavedPiece& piece) {
  std::string bytes(static_cast<size_t>(piece.entry.size()), '\0');
  RETURN_IF_ERROR(reader.CheckEntryRange(piece.label, piece.entry));
  RETURN_IF_ERROR(reader.ReadEntry(piece.label, piece.entry, bytes.data()));
  return bytes;
}

// The elements of a string tensor (never sliced: TF and ckptd store them whole).
absl::StatusOr<std::vector<std::string>> ReadStrings(BundleReader& reader, const ckptd::TensorInfo& info) {
  if (info.pieces.size() != 1) return absl::UnimplementedError("a sliced string tensor");
  ASSIGN_OR_RETURN(std::string encoded, ReadEntryBytes(reader, info.pieces[0]));
  int64_t count = 0;
  RETURN_IF_ERROR(ckptd::CheckShape(info.shape, &count));
  return ckptd::DecodeStrings(encoded, count);
}

absl::StatusOr<ckptd::TensorStats> Stats(BundleReader& reader, const ckptd::TensorInfo& info) {
  ckptd::TensorStats stats;
  std::vector<double> values;
  RETURN_IF_ERROR(ForEachChunk(reader, info, [&](const std::string& bytes) {
    values.clear();
    RETURN_IF_ERROR(ckptd::ElementsAsDouble(info.dtype, bytes.data(),
                                            bytes.size() / ckptd::DataTypeSize(info.dtype), &values));
    stats.Add(values);
    return absl::OkStatus();
  }));
  return stats;
}

json StatsJson(const ckptd::TensorStats& s) {
  json j = {{"count", s.count}, {"nan", s.nan}, {"pos_inf", s.pos_inf}, {"neg_inf", s.neg_inf}};
  if (s.finite > 0) {
    j["min"] = s.min;
    j["max"] = s.max;
    j["mean"] = s.mean();
  } else {
    j["min"] = j["max"] = j["mean"] = nullptr;
  }
  return j;
}

std::string StatsText(int dtype, const ckptd::TensorStats& s) {
  if (s.finite == 0) {
    return absl::StrCat("no finite value; nan ", s.nan, " +inf ", s.pos_inf, " -inf ", s.neg_inf);
  }
  return absl::StrCat("min ", ckptd::FormatNumber(dtype, s.min), " max ", ckptd::FormatNumber(dtype, s.max),
                      " mean ", ckptd::FormatNumber(ckptd::kDouble, s.mean()), " nan ", s.nan, " +inf ",
                      s.pos_inf, " -inf ", s.neg_inf);
}

// numpy prints every element up to this many, else a summary.
constexpr int64_t kSummarizeAbove = 1000;
// --values --json holds every element; beyond this, export is the tool.
constexpr int64_t kMaxJsonValues = 10'000'000;

json NestedJson(const ckptd::Shape& shape, const std::vector<json>& flat, size_t dim, size_t* next) {
  if (dim == shape.size()) return flat[(*next)++];
  json out = json::array();
  for (int64_t i = 0; i < shape[dim]; ++i) out.push_back(NestedJson(shape, flat, dim + 1, next));
  return out;
}

json NumberJson(int dtype, double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (dtype == ckptd::kBool) return v != 0;
  if (!ckptd::IsFloating(dtype)) {
    if (dtype == ckptd::kUint64) return static_cast<uint64_t>(v);
    return static_cast<int64_t>(v);
  }
  return v;
}

// inspect --values NAME: the tensor's elements, numpy-style (summarized beyond 1000
// elements, as numpy prints), or every one of them in JSON.
int PrintValues(BundleReader& reader, const std::string& name, bool as_json) {
  auto info = reader.Lookup(name);
  if (!info.ok()) return Error(info.status());
  int64_t count = 0;
  if (absl::Status s = ckptd::CheckShape(info->shape, &count); !s.ok()) return Error(s);
  const bool is_string = info->dtype == ckptd::kString;
  if (!is_string && !ckptd::IsRealNumeric(info->dtype)) {
    return Error(absl::UnimplementedError(
        absl::StrCat("'", name, "': ", ckptd::DataTypeName(info->dtype), " values cannot be shown")));
  }
  std::vector<std::string> strings;
  if (is_string) {
    auto decoded = ReadStrings(reader, *info);
    if (!decoded.ok()) return Error(decoded.status());
    strings = std::move(*decoded);
  }
  const bool summarize = !as_json && count > kSummarizeAbove;
  if (as_json && count > kMaxJsonValues) {
    return Error(absl::InvalidArgumentError(
        absl::StrCat("'", name, "' has ", count, " elements; --values --json prints at most ", kMaxJsonValues,
                     " (use ckptctl export for whole arrays)")));
  }
  // Row-major flat values of the whole tensor, or (summarized) of the grid shown.
  std::vector<double> numbers;
  if (!is_string && summarize) {
    if (absl::Status s = reader.CheckBoxReadable(*info, ckptd::Box::Full(info->shape)); !s.ok())
      return Error(s);
  }
  if (!is_string && !summarize) {
    absl::Status s = ForEachChunk(reader, *info, [&](const std::string& bytes) {
      return ckptd::ElementsAsDouble(info->dtype, bytes.data(),
                                     bytes.size() / ckptd::DataTypeSize(info->dtype), &numbers);
    });
    if (!s.ok()) return Error(s);
  }
  std::vector<std::string> shown;
  std::vector<json> shown_json;
  const size_t rank = info->shape.size();
  std::vector<std::vector<int64_t>> axes;
  for (int64_t d : info->shape) {
    std::vector<int64_t> all(static_cast<size_t>(d));
    for (int64_t i = 0; i < d; ++i) all[static_cast<size_t>(i)] = i;
    axes.push_back(summarize ? ckptd::SummaryIndices(d) : all);
  }
  bool empty = false;
  for (const auto& a : axes) empty = empty || a.empty();
  std::vector<size_t> at(rank, 0);
  ckptd::Box one{ckptd::Shape(rank, 0), ckptd::Shape(rank, 1)};
  std::string element(static_cast<size_t>(ckptd::DataTypeSize(info->dtype)), '\0');
  while (!empty) {
    int64_t flat = 0;
    for (size_t d = 0; d < rank; ++d) {
      one.start[d] = axes[d][at[d]];
      flat = flat * info->shape[d] + one.start[d];
    }
    const auto index = static_cast<size_t>(flat);
    if (is_string) {
      shown.push_back(ckptd::FormatBytes(strings[index]));
      shown_json.push_back(strings[index]);
    } else {
      double v;
      if (summarize) {
        std::vector<double> single;
        absl::Status s = reader.ReadBox(*info, one, element.data());
        if (s.ok()) s = ckptd::ElementsAsDouble(info->dtype, element.data(), 1, &single);
        if (!s.ok()) return Error(s);
        v = single[0];
      } else {
        v = numbers[index];
      }
      shown.push_back(ckptd::FormatNumber(info->dtype, v));
      shown_json.push_back(NumberJson(info->dtype, v));
    }
    size_t d = rank;  // the next index tuple, row-major
    while (d > 0 && ++at[d - 1] == axes[d - 1].size()) at[--d] = 0;
    if (d == 0) break;
  }
  if (as_json) {
    size_t next = 0;
    PrintJson({{"name", name},
               {"dtype", ckptd::DataTypeName(info->dtype)},
               {"shape", info->shape},
               {"values", empty ? json::array() : NestedJson(info->shape, shown_json, 0, &next)}});
    return kOk;
  }
  std::printf("%s %s %s\n", name.c_str(), ckptd::DataTypeName(info->dtype).c_str(),
              ShapeString(info->shape).c_str());
  std::printf("%s\n", empty ? "[]" : ckptd::FormatNested(info->shape, shown, summarize).c_str());
  return kOk;
}

// ckptd.json's facts about the step, for inspect.
json MetaJson(const ckptd::CheckpointMeta& meta) {
  json hosts = json::array();
  for (const ckptd::CheckpointMeta::Host& h : meta.hosts) {
    hosts.push_back({{"rank", h.rank},
                     {"host", h.host},
                     {"file", h.file},
                     {"bytes", h.bytes},
                     {"write_seconds", h.write_seconds},
                     {"copies", h.copies}});
  }
  json out = {{"run", meta.run},
              {"step", meta.step},
              {"version", meta.version},
              {"storage", meta.storage},
              {"trainer_count", meta.trainer_count},
              {"num_hosts", meta.num_hosts},
              {"created_unix", meta.created_unix},
              {"commit_seconds", meta.commit_seconds},
              {"max_write_seconds", meta.max_write_seconds},
              {"hosts", hosts}};
  if (!meta.imported_from.empty()) out["imported_from"] = meta.imported_from;
  return out;
}

void PrintMeta(const ckptd::CheckpointMeta& meta) {
  if (!meta.imported_from.empty()) {
    std::printf("run %s, step %lld, imported from a %s by ckptctl %s at %s; %d data file(s)\n",
                meta.run.c_str(), static_cast<long long>(meta.step), meta.imported_from.c_str(),
                meta.version.c_str(), LocalTime(static_cast<double>(meta.created_unix)).c_str(),
                meta.num_hosts);
    return;
  }
  std::printf("run %s, step %lld, saved by ckptd %s at %s; %d trainer(s) on %d host(s), storage %s\n",
              meta.run.c_str(), static_cast<long long>(meta.step), meta.version.c_str(),
              LocalTime(static_cast<double>(meta.created_unix)).c_str(), meta.trainer_count, meta.num_hosts,
              meta.storage.c_str());
  std::printf("commit %.3f s, slowest host write %.3f s\n", meta.commit_seconds, meta.max_write_seconds);
  for (const ckptd::CheckpointMeta::Host& h : meta.hosts) {
    std::printf(
        "  rank %d%s: %s, %s, written in %.3f s%s\n", h.rank,
        h.host.empty() ? "" : absl::StrCat(" (", h.host, ")").c_str(), h.file.c_str(),
        HumanBytes(static_cast<double>(h.bytes)).c_str(), h.write_seconds,
        h.copies.empty() ? "" : absl::StrCat(", copies on rank ", absl::StrJoin(h.copies, ",")).c_str());
  }
}

// Trainer state (kTrainerStatePrefix + "<trainer>/<key>") among `names`:
// trainer -> key -> value.
absl::StatusOr<std::map<std::string, std::map<std::string, std::string>>> TrainerState(
    BundleReader& reader, const std::vector<std::string>& names) {
  std::map<std::string, std::map<std::string, std::string>> out;
  for (const std::string& name : names) {
    if (!absl::StartsWith(name, ckptd::kTrainerStatePrefix)) continue;
    const std::string rest = name.substr(std::strlen(ckptd::kTrainerStatePrefix));
    const size_t slash = rest.find('/');
    if (slash == std::string::npos) continue;
    ASSIGN_OR_RETURN(ckptd::TensorInfo info, reader.Lookup(name));
    if (info.dtype != ckptd::kString || !info.shape.empty()) continue;
    ASSIGN_OR_RETURN(std::vector<std::string> value, ReadStrings(reader, info));
    out[rest.substr(0, slash)][rest.substr(slash + 1)] = value.empty() ? "" : value[0];
  }
  return out;
}

}  // namespace

// --- inspect ----------------------------------------------------------------------

int Inspect(const std::string& arg, const std::string& pattern, bool as_json, const InspectOptions& options) {
  std::string prefix;
  auto reader = OpenCheckpoint(arg, &prefix);
  if (!reader.ok()) return Error(reader.status());
  if (!options.values.empty()) return PrintValues(**reader, options.values, as_json);
  auto names = SelectNames(**reader, pattern);
  if (!names.ok()) return Error(names.status());
  // ckptd.json, when the checkpoint is ours, adds the mesh and each tensor's layout.
  const ckptd::CheckpointMeta meta = ReadMeta(prefix);
  const bool ours = !meta.run.empty();
  const HostPart part = PartHere(prefix, meta);
  const std::string mesh = meta.mesh;
  std::map<std::string, std::string> layouts;
  for (const ckptd::CheckpointMeta::Tensor& t : meta.tensors) {
    if (!t.layout.empty()) layouts[t.name] = t.layout;
  }
  if (options.stats && !part.elsewhere.empty()) {
    return Error(absl::FailedPreconditionError(absl::StrCat("cannot compute --stats: ", part.Note(prefix))));
  }
  auto state = TrainerState(**reader, *names);
  if (!state.ok() && part.elsewhere.empty()) return Error(state.status());
  json entries = json::array();
  if (!as_json) {
    std::printf("%s: %d shard(s), %zu tensor(s)%s\n", prefix.c_str(), (*reader)->header().num_shards(),
                names->size(), pattern.empty() ? "" : absl::StrCat(" matching '", pattern, "'").c_str());
    if (ours) PrintMeta(meta);
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
    std::optional<ckptd::TensorStats> stats;
    if (options.stats && ckptd::IsRealNumeric(info->dtype)) {
      auto computed = Stats(**reader, *info);
      if (!computed.ok()) return Error(computed.status());
      stats = *computed;
      j["stats"] = StatsJson(*stats);
    }
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
    if (stats) std::printf("      %s\n", StatsText(info->dtype, *stats).c_str());
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
    if (ours) out["checkpoint"] = MetaJson(meta);
    if (state.ok() && !state->empty()) out["trainer_state"] = *state;
    if (!part.elsewhere.empty()) out["shards_elsewhere"] = part.elsewhere;
    PrintJson(out);
  } else if (state.ok() && !state->empty()) {
    std::printf("trainer state:\n");
    for (const auto& [trainer, keys] : *state) {
      for (const auto& [key, value] : keys) {
        std::printf("  trainer %s  %s = %s\n", trainer.c_str(), key.c_str(),
                    ckptd::FormatBytes(value).c_str());
      }
    }
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

namespace {

int64_t TensorBytes(const ckptd::TensorInfo& info) {
  return ckptd::Box::Full(info.shape).NumElements() * ckptd::DataTypeSize(info.dtype);
}

// Files an earlier safetensors export may have left in `dir`: a new export replaces
// them all, or a stale shard would sit beside a new index.
std::vector<std::string> SafetensorsFilesIn(ckptd::FileSystem* fs, const std::string& dir) {
  std::vector<std::string> out;
  for (const std::string& name : fs->ListDir(dir).value_or(std::vector<std::string>{})) {
    const bool shard = absl::StartsWith(name, "model-") && absl::StrContains(name, "-of-") &&
                       absl::EndsWith(name, ".safetensors");
    if (shard || name == "model.safetensors" || name == "model.safetensors.index.json") {
      out.push_back(ckptd::JoinPath(dir, name));
    }
  }
  return out;
}

}  // namespace

int Export(const std::string& arg, const ExportOptions& options, bool as_json) {
  ckptd::FileSystem* fs = ckptd::PosixFileSystem();
  const std::string& format = options.format;
  const std::string& out_dir = options.out_dir;
  std::string prefix;
  auto reader = OpenCheckpoint(arg, &prefix);
  if (!reader.ok()) return Error(reader.status());
  const ckptd::CheckpointMeta meta = ReadMeta(prefix);
  if (const HostPart part = PartHere(prefix, meta); !part.elsewhere.empty()) {
    return Error(
        absl::FailedPreconditionError(absl::StrCat("cannot export whole tensors: ", part.Note(prefix))));
  }
  auto names = SelectNames(**reader, options.pattern);
  if (!names.ok()) return Error(names.status());
  if (names->empty()) {
    return Error(
        absl::NotFoundError(absl::StrCat("no tensor of ", prefix, " matches '", options.pattern, "'")));
  }
  if (absl::Status s = (*reader)->OpenAllDataFiles(); !s.ok()) return Error(s);
  std::vector<ckptd::TensorInfo> infos;
  json skipped = json::array();
  std::vector<std::string> skipped_text;
  for (const std::string& name : *names) {
    auto info = (*reader)->Lookup(name);
    if (!info.ok()) return Error(info.status());
    const bool exportable = format == "npy"
                                ? info->dtype == ckptd::kBfloat16 || ckptd::NpyHeader(info->dtype, {}).ok()
                                : ckptd::SafetensorsDtype(info->dtype).ok();
    if (!exportable) {
      skipped.push_back({{"name", name}, {"dtype", ckptd::DataTypeName(info->dtype)}});
      skipped_text.push_back(absl::StrCat(name, " (", ckptd::DataTypeName(info->dtype), ")"));
      continue;
    }
    for (const ckptd::SavedPiece& p : info->pieces) {
      if (absl::Status s = (*reader)->CheckEntryRange(name, p.entry); !s.ok()) return Error(s);
    }
    infos.push_back(std::move(*info));
  }
  if (infos.empty()) {
    return Error(absl::FailedPreconditionError(
        absl::StrCat("nothing to export: every matching tensor has a dtype ", format,
                     " cannot hold: ", absl::StrJoin(skipped_text, ", "))));
  }
  // The files this export writes: (path, indices into infos).
  std::vector<std::pair<std::string, std::vector<size_t>>> plan;
  if (format == "npy") {
    for (size_t i = 0; i < infos.size(); ++i) {
      plan.push_back({ckptd::JoinPath(out_dir, ckptd::TensorFileName(infos[i].name) + ".npy"), {i}});
    }
  } else {
    // Shards as Hugging Face's save_pretrained cuts them: in order, a new shard when
    // the next tensor would pass the limit; a tensor above it gets a shard alone.
    std::vector<std::vector<size_t>> shards(1);
    int64_t in_shard = 0;
    for (size_t i = 0; i < infos.size(); ++i) {
      const int64_t bytes = TensorBytes(infos[i]);
      if (!shards.back().empty() && in_shard + bytes > options.max_shard_bytes) {
        shards.emplace_back();
        in_shard = 0;
      }
      shards.back().push_back(i);
      in_shard += bytes;
    }
    for (size_t k = 0; k < shards.size(); ++k) {
      const std::string name = shards.size() == 1
                                   ? "model.safetensors"
                                   : absl::StrFormat("model-%05d-of-%05d.safetensors", k + 1, shards.size());
      plan.push_back({ckptd::JoinPath(out_dir, name), shards[k]});
    }
  }
  const std::string index_path = ckptd::JoinPath(out_dir, "model.safetensors.index.json");
  const bool sharded = format == "safetensors" && plan.size() > 1;
  // Refuse to overwrite anything unless --force.
  std::vector<std::string> replaced;
  for (const auto& [path, unused] : plan) {
    if (fs->Exists(path)) replaced.push_back(path);
  }
  std::vector<std::string> stale;
  if (format == "safetensors") {
    for (const std::string& path : SafetensorsFilesIn(fs, out_dir)) {
      const bool written =
          std::any_of(plan.begin(), plan.end(), [&](const auto& p) { return p.first == path; }) ||
          (sharded && path == index_path);
      if (!written) stale.push_back(path);
      if (!written || path == index_path) replaced.push_back(path);
    }
  }
  if (!replaced.empty() && !options.force) {
    std::sort(replaced.begin(), replaced.end());
    replaced.erase(std::unique(replaced.begin(), replaced.end()), replaced.end());
    return Error(absl::AlreadyExistsError(
        absl::StrCat(replaced.size(), " file(s) of an earlier export are in ", out_dir, " (",
                     replaced.front(), replaced.size() > 1 ? ", ..." : "", "); --force replaces them")));
  }
  if (absl::Status s = fs->CreateDirs(out_dir, 0755); !s.ok()) return Error(s);
  for (const std::string& name : skipped_text) {
    std::fprintf(stderr, "skipped %s: %s has no such dtype\n", name.c_str(), format.c_str());
  }
  int64_t total = 0;
  for (const ckptd::TensorInfo& info : infos) total += TensorBytes(info);
  Progress progress("export");
  int64_t done = 0;
  const auto advance = [&](const ckptd::TensorInfo& info) {
    done += TensorBytes(info);
    if (!options.quiet && !as_json) progress.Update(done, total);
  };
  json files = json::array();
  std::string bytes;
  json weight_map = json::object();
  for (const auto& file : plan) {
    const std::string& path = file.first;
    const std::vector<size_t>& members = file.second;  // a plain name: lambdas below capture it
    absl::Status s;
    if (format == "npy") {
      const ckptd::TensorInfo& info = infos[members[0]];
      s = ReadWhole(**reader, info, /*widen_bfloat16=*/true, &bytes);
      const int dtype = info.dtype == ckptd::kBfloat16 ? ckptd::kFloat : info.dtype;
      if (s.ok()) s = fs->CreateDirs(ckptd::DirName(path), 0755);
      if (s.ok()) {
        s = WriteFileWhole(fs, path, [&](const std::string& to) {
          return ckptd::WriteNpy(fs, to, dtype, info.shape, bytes);
        });
      }
      if (s.ok()) {
        files.push_back({{"name", info.name}, {"path", path}, {"dtype", ckptd::DataTypeName(dtype)}});
        advance(info);
      }
    } else {
      std::vector<ckptd::ExportTensor> tensors;
      for (size_t i : members) {
        tensors.push_back({infos[i].name, infos[i].dtype, infos[i].shape});
        weight_map[infos[i].name] = path.substr(path.rfind('/') + 1);
      }
      // No paths in the metadata: the file may travel; run and step say what it is.
      std::vector<std::pair<std::string, std::string>> metadata = {{"format", "pt"}};
      if (!meta.run.empty()) {
        metadata.emplace_back("run", meta.run);
        metadata.emplace_back("step", std::to_string(meta.step));
      }
      s = WriteFileWhole(fs, path, [&](const std::string& to) {
        return ckptd::WriteSafetensors(fs, to, tensors, metadata, [&](size_t i, std::string* out) {
          RETURN_IF_ERROR(ReadWhole(**reader, infos[members[i]], /*widen_bfloat16=*/false, out));
          advance(infos[members[i]]);
          return absl::OkStatus();
        });
      });
      if (s.ok()) files.push_back({{"path", path}, {"tensors", tensors.size()}});
    }
    if (!s.ok()) return Error(s);
  }
  if (sharded) {
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    if (absl::Status s = fs->WriteFileAtomically(index_path, index.dump(2) + "\n"); !s.ok()) return Error(s);
  }
  for (const std::string& path : stale) {
    if (absl::Status s = fs->DeleteFile(path); !s.ok()) return Error(s);
  }
  if (as_json) {
    json out = {
        {"prefix", prefix}, {"format", format}, {"files", files}, {"bytes", total}, {"skipped", skipped}};
    if (sharded) out["index"] = index_path;
    PrintJson(out);
    return kOk;
  }
  for (const auto& f : files) {
    if (f.contains("name")) {
      std::printf("%s -> %s\n", f["name"].get<std::string>().c_str(), f["path"].get<std::string>().c_str());
    } else {
      std::printf("%zu tensor(s) -> %s\n", f["tensors"].get<size_t>(), f["path"].get<std::string>().c_str());
    }
  }
  if (sharded) std::printf("index -> %s\n", index_path.c_str());
  std::printf("exported %zu tensor(s), %s, as %s into %s", infos.size(), HumanBytes(total).c_str(),
              format.c_str(), out_dir.c_str());
  if (!skipped_text.empty()) {
    std::printf("; skipped %zu with no %s dtype: %s", skipped_text.size(), format.c_str(),
                absl::StrJoin(skipped_text, ", ").c_str());
  }
  std::printf("\n");
  return kOk;
}

// --- diff -------------------------------------------------------------------------
namespace {

// crc32c of a string tensor's bytes as saved.
absl::StatusOr<uint32_t> StringChecksum(BundleReader& reader, const ckptd::TensorInfo& info) {
  ASSIGN_OR_RETURN(std::string bytes, ReadEntryBytes(reader, info.pieces[0]));
  return ckptd::crc32c::Value(bytes.data(), bytes.size());
}

// Two tensors of one dtype and shape read side by side, row chunk by row chunk, each
// assembled from its own slices: whether their bytes are equal and, for numbers,
// how their values differ under the tolerance.
struct Comparison {
  bool bytes_equal = true;
  ckptd::ValueDiff values;
};

absl::StatusOr<Comparison> Compare(BundleReader& a, const ckptd::TensorInfo& ia, BundleReader& b,
                                   const ckptd::TensorInfo& ib, double atol, double rtol) {
  Comparison out;
  const ckptd::Box full = ckptd::Box::Full(ia.shape);
  RETURN_IF_ERROR(a.CheckBoxReadable(ia, full));
  RETURN_IF_ERROR(b.CheckBoxReadable(ib, full));
  const int64_t element_bytes = ckptd::DataTypeSize(ia.dtype);
  const bool numeric = ckptd::IsRealNumeric(ia.dtype);
  std::string bytes_a, bytes_b;
  std::vector<double> values_a, values_b;
  for (const ckptd::Box& box : RowChunks(ia.shape, ia.dtype)) {
    const auto size = static_cast<size_t>(box.NumElements() * element_bytes);
    bytes_a.resize(size);
    bytes_b.resize(size);
    RETURN_IF_ERROR(a.ReadBox(ia, box, bytes_a.data()));
    RETURN_IF_ERROR(b.ReadBox(ib, box, bytes_b.data()));
    out.bytes_equal = out.bytes_equal && bytes_a == bytes_b;
    if (!numeric) continue;
    values_a.clear();
    values_b.clear();
    const size_t count = size / static_cast<size_t>(element_bytes);
    RETURN_IF_ERROR(ckptd::ElementsAsDouble(ia.dtype, bytes_a.data(), count, &values_a));
    RETURN_IF_ERROR(ckptd::ElementsAsDouble(ib.dtype, bytes_b.data(), count, &values_b));
    out.values.Add(values_a, values_b, atol, rtol);
  }
  return out;
}

// A row-major index as "[i, j, k]".
std::string IndexString(const ckptd::Shape& shape, int64_t flat) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d > 0; --d) {
    index[d - 1] = shape[d - 1] == 0 ? 0 : flat % shape[d - 1];
    flat = shape[d - 1] == 0 ? 0 : flat / shape[d - 1];
  }
  return absl::StrCat("[", absl::StrJoin(index, ", "), "]");
}

}  // namespace

int Diff(const std::string& a_arg, const std::string& b_arg, const std::string& pattern,
         const DiffOptions& options, bool as_json) {
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
  const bool tolerant = options.atol.has_value() || options.rtol.has_value();
  const double atol = options.atol.value_or(0), rtol = options.rtol.value_or(0);
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
    json change = {{"name", name},
                   {"a", {{"dtype", ckptd::DataTypeName(ia->dtype)}, {"shape", ia->shape}}},
                   {"b", {{"dtype", ckptd::DataTypeName(ib->dtype)}, {"shape", ib->shape}}}};
    if (ia->dtype != ib->dtype) {
      change["kind"] = "dtype";
      change["change"] =
          absl::StrCat("dtype ", ckptd::DataTypeName(ia->dtype), " -> ", ckptd::DataTypeName(ib->dtype));
    } else if (ia->shape != ib->shape) {
      change["kind"] = "shape";
      change["change"] = absl::StrCat("shape ", ShapeString(ia->shape), " -> ", ShapeString(ib->shape));
    } else if (ia->dtype == ckptd::kString ||
               (!ckptd::IsRealNumeric(ia->dtype) && ia->pieces.size() == 1 && ib->pieces.size() == 1)) {
      // Strings (never sliced) and other whole entries of types without numbers: their
      // bytes, by checksum.
      auto ca = ia->dtype == ckptd::kString ? StringChecksum(**a, *ia) : ia->pieces[0].entry.crc32c();
      auto cb = ib->dtype == ckptd::kString ? StringChecksum(**b, *ib) : ib->pieces[0].entry.crc32c();
      if (!ca.ok()) return Error(ca.status());
      if (!cb.ok()) return Error(cb.status());
      if (*ca != *cb) {
        change["kind"] = "values";
        change["change"] = absl::StrFormat("bytes differ (crc32c %08x -> %08x)", *ca, *cb);
      }
    } else {
      // Whole entries on both sides compare by their checksums without reading; any
      // other pair (or a difference) is read side by side as logical tensors,
      // whatever slices each was saved as.
      const bool both_whole = ia->pieces.size() == 1 && ib->pieces.size() == 1 &&
                              ia->pieces[0].box.IsFull(ia->shape) && ib->pieces[0].box.IsFull(ib->shape);
      if (tolerant || !both_whole || ia->pieces[0].entry.crc32c() != ib->pieces[0].entry.crc32c()) {
        auto compared = Compare(**a, *ia, **b, *ib, atol, rtol);
        if (!compared.ok()) return Error(compared.status());
        const ckptd::ValueDiff& v = compared->values;
        const bool differs = tolerant ? v.mismatched > 0 : !compared->bytes_equal;
        if (differs) {
          change["kind"] = "values";
          change["compared"] = v.compared;
          change["mismatched"] = v.mismatched;
          change["max_abs_diff"] = v.max_abs_diff;
          if (v.first_index >= 0) change["first_mismatch"] = IndexString(ia->shape, v.first_index);
          change["change"] =
              v.mismatched == 0
                  ? std::string("bytes differ, values equal (signed zeros or NaN payloads)")
                  : absl::StrCat("values: ", v.mismatched, " of ", v.compared, " element(s) differ",
                                 tolerant ? absl::StrCat(" beyond atol ", atol, " rtol ", rtol) : "",
                                 ", max abs diff ", v.max_abs_diff, ", first at ",
                                 IndexString(ia->shape, v.first_index));
        }
      }
    }
    if (change.contains("kind")) {
      changed.push_back(change);
    } else {
      ++same;
    }
  }
  const bool differ = !added.empty() || !removed.empty() || !changed.empty();
  if (as_json) {
    json out = {{"a", a_prefix},      {"b", b_prefix},      {"added", added},
                {"removed", removed}, {"changed", changed}, {"unchanged", same}};
    if (tolerant) out["tolerance"] = {{"atol", atol}, {"rtol", rtol}};
    PrintJson(out);
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

int Gc(const std::string& dir, int keep_last, int keep_every, bool dry_run, bool quiet, bool as_json) {
  auto run_dir = OpenRunDir(dir);
  if (!run_dir.ok()) return Error(run_dir.status());
  const std::string& run = run_dir->run;
  const ckptd::CheckpointStore& store = run_dir->store;
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
