// The helpers ckptctl's offline commands share (offline_common.h).
#include "client/ckptctl/offline_common.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_join.h"
#include "client/tensor_values.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"

namespace ckptctl {

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

absl::Status CheckReachable(const std::string& path) {
  struct stat st;
  const bool found = ::stat(path.c_str(), &st) == 0;
  const int error = errno;
  if ((!found && error == EACCES) ||
      (found && S_ISDIR(st.st_mode) && ::access(path.c_str(), R_OK | X_OK) != 0 && errno == EACCES)) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": permission denied (uid ", ::geteuid(),
                     " may not read it or a directory on the way; checkpoints are private to the daemon's "
                     "user unless security.checkpoint_group opens them to a group)"));
  }
  return absl::OkStatus();
}

absl::Status RefuseRoot(ckptd::FileSystem* fs, const std::string& dir, absl::string_view want) {
  const std::vector<std::string> runs = RunsWithSteps(fs, dir);
  if (runs.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(dir, " is a checkpoint root with run(s) ",
                                                 absl::StrJoin(runs, ", "), ": ", want, " (e.g. ",
                                                 ckptd::JoinPath(TrimSlashes(dir), runs[0]), ")"));
}

absl::StatusOr<std::string> ResolvePrefix(ckptd::FileSystem* fs, const std::string& arg) {
  if (fs->Exists(ckptd::IndexPath(arg))) return arg;
  // Through a daemon there is no local permission to report; here, EACCES on the way
  // to `arg` (or its index, in the same directory) must not read as "no checkpoint".
  if (fs == ckptd::PosixFileSystem()) RETURN_IF_ERROR(CheckReachable(arg));
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
    RETURN_IF_ERROR(RefuseRoot(fs, arg, "name a run or one of its steps"));
  }
  return absl::NotFoundError(absl::StrCat(arg,
                                          ": no checkpoint here (want PREFIX with PREFIX.index, a step "
                                          "directory, or a directory with a `checkpoint` file)"));
}

// ckptd.json beside a prefix, when the checkpoint is ours (and readable); else
// defaults (a checkpoint TensorFlow wrote has none).
ckptd::CheckpointMeta ReadMeta(const Context& ctx, const std::string& prefix) {
  auto text = ctx.checkpoints->ReadFileToString(
      ckptd::JoinPath(ckptd::DirName(prefix), ckptd::kCheckpointMetaFile), 1 << 28);
  if (!text.ok()) return ckptd::CheckpointMeta{};
  return ckptd::CheckpointMeta::FromJson(*text).value_or(ckptd::CheckpointMeta{});
}

HostPart PartHere(const Context& ctx, const std::string& prefix, const ckptd::CheckpointMeta& meta) {
  HostPart part;
  if (meta.storage != "local") return part;
  for (const ckptd::CheckpointMeta::Host& h : meta.hosts) {
    if (ctx.checkpoints->Exists(ckptd::JoinPath(ckptd::DirName(prefix), h.file))) {
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

absl::StatusOr<RunDir> OpenRunDir(const std::string& dir) {
  ckptd::FileSystem* fs = ckptd::PosixFileSystem();
  const std::string trimmed = TrimSlashes(dir);
  RETURN_IF_ERROR(CheckReachable(trimmed));
  if (!fs->Exists(trimmed)) return absl::NotFoundError(absl::StrCat(dir, ": no such directory"));
  if (!fs->IsDirectory(trimmed)) return absl::NotFoundError(absl::StrCat(dir, " is not a directory"));
  if (fs->Exists(ckptd::IndexPath(ckptd::CheckpointStore::Prefix(trimmed)))) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, " is a step directory; this command takes a run directory (<root>/<run>)"));
  }
  return RunDir{trimmed.substr(trimmed.rfind('/') + 1), ckptd::CheckpointStore(fs, ckptd::DirName(trimmed))};
}

absl::StatusOr<std::string> StepOfRunDir(const std::string& run_dir, int64_t step) {
  ckptd::FileSystem* fs = ckptd::PosixFileSystem();
  const std::string prefix = StepPrefix(run_dir, step);
  if (fs->Exists(ckptd::IndexPath(prefix))) return prefix;
  RETURN_IF_ERROR(CheckReachable(run_dir));
  if (!fs->IsDirectory(run_dir)) return prefix;  // ResolvePrefix says what it is
  const std::vector<int64_t> steps = CommittedSteps(fs, run_dir);
  return absl::NotFoundError(
      absl::StrCat(run_dir, " has no committed step ", step, "; ",
                   steps.empty() ? std::string("it has no committed step at all")
                                 : absl::StrCat("its committed steps: ", absl::StrJoin(steps, ", "))));
}

absl::StatusOr<std::unique_ptr<BundleReader>> OpenCheckpoint(const Context& ctx, const std::string& arg,
                                                             std::string* prefix_out) {
  auto prefix = ResolvePrefix(ctx.checkpoints, arg);
  if (!prefix.ok()) return prefix.status();
  if (prefix_out != nullptr) *prefix_out = *prefix;
  return BundleReader::Open(ctx.checkpoints, *prefix);
}

namespace {

// Chunks of whole rows (along dimension 0) keep a huge tensor's read bounded.
constexpr int64_t kChunkBytes = 64 << 20;

}  // namespace

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

}  // namespace ckptctl
