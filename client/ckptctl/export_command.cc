// ckptctl export: tensors as .npy files or safetensors.
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

namespace {

// One export's files: (path, indices of the tensors it holds).
using ExportPlan = std::vector<std::pair<std::string, std::vector<size_t>>>;

// The tensors of `names` that `format` can hold, their pieces range-checked; the
// others are named in *skipped (JSON) and *skipped_text.
absl::StatusOr<std::vector<ckptd::TensorInfo>> ExportableTensors(BundleReader& reader,
                                                                 const std::vector<std::string>& names,
                                                                 const std::string& format, json* skipped,
                                                                 std::vector<std::string>* skipped_text) {
  std::vector<ckptd::TensorInfo> infos;
  for (const std::string& name : names) {
    ASSIGN_OR_RETURN(ckptd::TensorInfo info, reader.Lookup(name));
    const bool exportable = format == "npy"
                                ? info.dtype == ckptd::kBfloat16 || ckptd::NpyHeader(info.dtype, {}).ok()
                                : ckptd::SafetensorsDtype(info.dtype).ok();
    if (!exportable) {
      skipped->push_back({{"name", name}, {"dtype", ckptd::DataTypeName(info.dtype)}});
      skipped_text->push_back(absl::StrCat(name, " (", ckptd::DataTypeName(info.dtype), ")"));
      continue;
    }
    for (const ckptd::SavedPiece& p : info.pieces) RETURN_IF_ERROR(reader.CheckEntryRange(name, p.entry));
    infos.push_back(std::move(info));
  }
  if (infos.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("nothing to export: every matching tensor has a dtype ",
                                                      format,
                                                      " cannot hold: ", absl::StrJoin(*skipped_text, ", ")));
  }
  return infos;
}

// One .npy per tensor, or safetensors shards as Hugging Face's save_pretrained cuts
// them: in order, a new shard when the next tensor would pass the limit; a tensor
// above it gets a shard alone.
ExportPlan PlanExport(const std::vector<ckptd::TensorInfo>& infos, const ExportOptions& options) {
  ExportPlan plan;
  if (options.format == "npy") {
    for (size_t i = 0; i < infos.size(); ++i) {
      plan.push_back({ckptd::JoinPath(options.out_dir, ckptd::TensorFileName(infos[i].name) + ".npy"), {i}});
    }
    return plan;
  }
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
    plan.push_back({ckptd::JoinPath(options.out_dir, name), shards[k]});
  }
  return plan;
}

// Refuses to overwrite an earlier export unless --force (ALREADY_EXISTS); *stale: the
// earlier export's safetensors files this one does not write, to remove at the end.
absl::Status CheckOverwrites(ckptd::FileSystem* fs, const ExportPlan& plan, const ExportOptions& options,
                             const std::string& index_path, bool sharded, std::vector<std::string>* stale) {
  std::vector<std::string> replaced;
  for (const auto& [path, unused] : plan) {
    if (fs->Exists(path)) replaced.push_back(path);
  }
  if (options.format == "safetensors") {
    for (const std::string& path : SafetensorsFilesIn(fs, options.out_dir)) {
      const bool written =
          std::any_of(plan.begin(), plan.end(), [&](const auto& p) { return p.first == path; }) ||
          (sharded && path == index_path);
      if (!written) stale->push_back(path);
      if (!written || path == index_path) replaced.push_back(path);
    }
  }
  if (replaced.empty() || options.force) return absl::OkStatus();
  std::sort(replaced.begin(), replaced.end());
  replaced.erase(std::unique(replaced.begin(), replaced.end()), replaced.end());
  return absl::AlreadyExistsError(
      absl::StrCat(replaced.size(), " file(s) of an earlier export are in ", options.out_dir, " (",
                   replaced.front(), replaced.size() > 1 ? ", ..." : "", "); --force replaces them"));
}

// Writes one planned file whole (see WriteFileWhole) and describes it in *files;
// `advance` is called after each tensor written; *weight_map names each safetensors
// tensor's file. *bytes: a buffer the calls share, so each .npy reuses its memory.
absl::Status WriteExportFile(OutputFiles& output, BundleReader& reader,
                             const std::vector<ckptd::TensorInfo>& infos, const std::string& path,
                             const std::vector<size_t>& members, const ckptd::CheckpointMeta& meta,
                             const ExportOptions& options,
                             const std::function<void(const ckptd::TensorInfo&)>& advance, std::string* bytes,
                             json* files, json* weight_map) {
  ckptd::FileSystem* fs = output.fs();
  if (options.format == "npy") {
    const ckptd::TensorInfo& info = infos[members[0]];
    RETURN_IF_ERROR(ReadWhole(reader, info, /*widen_bfloat16=*/true, bytes));
    const int dtype = info.dtype == ckptd::kBfloat16 ? ckptd::kFloat : info.dtype;
    RETURN_IF_ERROR(output.Write(
        path, [&](const std::string& to) { return ckptd::WriteNpy(fs, to, dtype, info.shape, *bytes); }));
    files->push_back({{"name", info.name}, {"path", path}, {"dtype", ckptd::DataTypeName(dtype)}});
    advance(info);
    return absl::OkStatus();
  }
  std::vector<ckptd::ExportTensor> tensors;
  for (size_t i : members) {
    tensors.push_back({infos[i].name, infos[i].dtype, infos[i].shape});
    (*weight_map)[infos[i].name] = path.substr(path.rfind('/') + 1);
  }
  // No paths in the metadata: the file may travel; run and step say what it is.
  std::vector<std::pair<std::string, std::string>> metadata = {{"format", "pt"}};
  if (!meta.run.empty()) {
    metadata.emplace_back("run", meta.run);
    metadata.emplace_back("step", std::to_string(meta.step));
  }
  RETURN_IF_ERROR(output.Write(path, [&](const std::string& to) {
    return ckptd::WriteSafetensors(fs, to, tensors, metadata, [&](size_t i, std::string* out) {
      RETURN_IF_ERROR(ReadWhole(reader, infos[members[i]], /*widen_bfloat16=*/false, out));
      advance(infos[members[i]]);
      return absl::OkStatus();
    });
  }));
  files->push_back({{"path", path}, {"tensors", tensors.size()}});
  return absl::OkStatus();
}

void PrintExported(const json& files, const std::string& index_path, bool sharded, size_t count,
                   int64_t total, const ExportOptions& options,
                   const std::vector<std::string>& skipped_text) {
  for (const auto& f : files) {
    if (f.contains("name")) {
      std::printf("%s -> %s\n", f["name"].get<std::string>().c_str(), f["path"].get<std::string>().c_str());
    } else {
      std::printf("%zu tensor(s) -> %s\n", f["tensors"].get<size_t>(), f["path"].get<std::string>().c_str());
    }
  }
  if (sharded) std::printf("index -> %s\n", index_path.c_str());
  std::printf("exported %zu tensor(s), %s, as %s into %s", count, HumanBytes(total).c_str(),
              options.format.c_str(), options.out_dir.c_str());
  if (!skipped_text.empty()) {
    std::printf("; skipped %zu with no %s dtype: %s", skipped_text.size(), options.format.c_str(),
                absl::StrJoin(skipped_text, ", ").c_str());
  }
  std::printf("\n");
}

}  // namespace

int Export(const Context& ctx, const std::string& arg, const ExportOptions& options, bool as_json) {
  ckptd::FileSystem* fs = ckptd::PosixFileSystem();
  std::string prefix;
  auto reader = OpenCheckpoint(ctx, arg, &prefix);
  if (!reader.ok()) return Error(reader.status());
  const ckptd::CheckpointMeta meta = ReadMeta(ctx, prefix);
  if (const HostPart part = PartHere(ctx, prefix, meta); !part.elsewhere.empty()) {
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
  json skipped = json::array();
  std::vector<std::string> skipped_text;
  auto infos = ExportableTensors(**reader, *names, options.format, &skipped, &skipped_text);
  if (!infos.ok()) return Error(infos.status());
  const ExportPlan plan = PlanExport(*infos, options);
  const std::string index_path = ckptd::JoinPath(options.out_dir, "model.safetensors.index.json");
  const bool sharded = options.format == "safetensors" && plan.size() > 1;
  std::vector<std::string> stale;
  if (absl::Status s = CheckOverwrites(fs, plan, options, index_path, sharded, &stale); !s.ok())
    return Error(s);
  // A failed export leaves nothing behind: no file of its own, no directory it made.
  OutputFiles output(options.out_dir);
  if (absl::Status s = output.CreateDirs(options.out_dir); !s.ok()) return Error(s);
  for (const std::string& name : skipped_text) {
    std::fprintf(stderr, "skipped %s: %s has no such dtype\n", name.c_str(), options.format.c_str());
  }
  int64_t total = 0;
  for (const ckptd::TensorInfo& info : *infos) total += TensorBytes(info);
  Progress progress("export");
  int64_t done = 0;
  const auto advance = [&](const ckptd::TensorInfo& info) {
    done += TensorBytes(info);
    if (!options.quiet && !as_json) progress.Update(done, total);
  };
  json files = json::array();
  json weight_map = json::object();
  std::string bytes;
  for (const auto& [path, members] : plan) {
    absl::Status s = WriteExportFile(output, **reader, *infos, path, members, meta, options, advance, &bytes,
                                     &files, &weight_map);
    if (!s.ok()) return Error(s);
  }
  if (sharded) {
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    absl::Status s = output.Write(
        index_path, [&](const std::string& to) { return fs->WriteFileAtomically(to, index.dump(2) + "\n"); });
    if (!s.ok()) return Error(s);
  }
  for (const std::string& path : stale) {
    if (absl::Status s = fs->DeleteFile(path); !s.ok()) return Error(s);
  }
  output.Keep();
  if (as_json) {
    json out = {{"prefix", prefix},
                {"format", options.format},
                {"files", files},
                {"bytes", total},
                {"skipped", skipped}};
    if (sharded) out["index"] = index_path;
    PrintJson(out);
    return kOk;
  }
  PrintExported(files, index_path, sharded, infos->size(), total, options, skipped_text);
  return kOk;
}

}  // namespace ckptctl
