// What ckptctl's offline commands share: finding the checkpoint an argument names
// (a bundle prefix, a step, run or root directory), reading its ckptd.json and a
// tensor's bytes in bounded chunks. Read through Context::checkpoints (this machine's
// files, or a daemon's with --address). Single-threaded, as ckptctl is.
#ifndef CKPTD_CLIENT_CKPTCTL_OFFLINE_COMMON_H_
#define CKPTD_CLIENT_CKPTCTL_OFFLINE_COMMON_H_

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "client/ckptctl/commands.h"
#include "daemon/bundle/bundle.h"
#include "daemon/bundle/checkpoint_meta.h"
#include "daemon/io/file_system.h"
#include "daemon/store/checkpoint_store.h"

namespace ckptctl {

using ckptd::BundleReader;

// `dir` without trailing slashes (a lone "/" stays).
std::string TrimSlashes(std::string dir);
// A ckptd run directory <root>/<run>: its committed steps, ascending, as ls finds
// them (step-* directories holding ckpt.index); empty for any other directory.
std::vector<int64_t> CommittedSteps(ckptd::FileSystem* fs, const std::string& dir);
// The runs under a checkpoint root that have at least one committed step, by name.
std::vector<std::string> RunsWithSteps(ckptd::FileSystem* fs, const std::string& root);
// The bundle prefix of `step` of a run directory.
std::string StepPrefix(const std::string& run_dir, int64_t step);
// The bundle prefix `arg` names: a prefix, a step directory (holding ckpt.index), a
// run directory (its newest committed step, or what TF's `checkpoint` state file
// names) or a directory holding exactly one PREFIX.index.
absl::StatusOr<std::string> ResolvePrefix(ckptd::FileSystem* fs, const std::string& arg);
// ckptd.json beside a prefix, when the checkpoint is ours (and readable); else
// defaults (a checkpoint TensorFlow wrote has none).
ckptd::CheckpointMeta ReadMeta(const Context& ctx, const std::string& prefix);

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

HostPart PartHere(const Context& ctx, const std::string& prefix, const ckptd::CheckpointMeta& meta);

// The tensor names of `reader` that `pattern` selects (see FilterNames).
absl::StatusOr<std::vector<std::string>> SelectNames(const BundleReader& reader, const std::string& pattern);

// A run directory <root>/<run> as the store that holds it and the run's name.
struct RunDir {
  std::string run;
  ckptd::CheckpointStore store;
};

// A run directory of this machine; NOT_FOUND or INVALID_ARGUMENT (a step directory)
// naming `dir`.
absl::StatusOr<RunDir> OpenRunDir(const std::string& dir);
// PERMISSION_DENIED naming `path` when this user may not reach or read it (stat or
// access fail with EACCES); OK otherwise, whether or not it exists.
absl::Status CheckReachable(const std::string& path);
// INVALID_ARGUMENT when `dir` is a root of runs, not what the command takes:
// "DIR is a checkpoint root with run(s) a, b: <want> (e.g. DIR/a)"; OK otherwise.
absl::Status RefuseRoot(ckptd::FileSystem* fs, const std::string& dir, absl::string_view want);
// The bundle prefix of committed `step` of a run directory; NOT_FOUND listing the
// steps it has when that one is not among them.
absl::StatusOr<std::string> StepOfRunDir(const std::string& run_dir, int64_t step);

// The boxes of consecutive runs of whole rows of a tensor of `shape`, each about
// 64 MiB or one row, in row-major order; a scalar or a tensor without rows is one box.
std::vector<ckptd::Box> RowChunks(const ckptd::Shape& shape, int dtype);
// Calls fn(bytes) for each of RowChunks of tensor `info`, assembled from whatever
// slices were saved.
absl::Status ForEachChunk(BundleReader& reader, const ckptd::TensorInfo& info,
                          const std::function<absl::Status(const std::string&)>& fn);
// The bytes of one stored entry, range-checked first and checksummed as read.
absl::StatusOr<std::string> ReadEntryBytes(BundleReader& reader, const ckptd::SavedPiece& piece);
// The elements of a string tensor (never sliced: TF and ckptd store them whole).
absl::StatusOr<std::vector<std::string>> ReadStrings(BundleReader& reader, const ckptd::TensorInfo& info);

}  // namespace ckptctl

#endif  // CKPTD_CLIENT_CKPTCTL_OFFLINE_COMMON_H_
