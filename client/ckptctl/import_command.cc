// ckptctl import: an existing checkpoint (any TensorFlow V2 bundle, or safetensors:
// one file or Hugging Face's shards with their index) becomes a committed step of a
// run, published as a commit publishes one (a temp directory, verified, renamed), so
// trainers restore it through the daemon into any layout.
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ckptd/v1/wire.h"
#include "client/ckptctl/commands.h"
#include "client/ckptctl/offline_common.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/bundle/checkpoint_meta.h"
#include "daemon/io/private_dir.h"
#include "daemon/store/checkpoint_store.h"

namespace ckptctl {
namespace {

constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;  // as the reference reader
constexpr size_t kCopyChunk = 8 << 20;

struct ImportedTensor {
  std::string name{};
  int dtype = 0;
  ckptd::Shape shape{};
  int shard = 0;
  uint64_t begin = 0;  // byte range in its safetensors file's data section
  uint64_t end = 0;
};

absl::StatusOr<int> DtypeOfSafetensors(const std::string& name) {
  static const std::map<std::string, int> kTypes = {
      {"F64", ckptd::kDouble}, {"F32", ckptd::kFloat},  {"F16", ckptd::kHalf},   {"BF16", ckptd::kBfloat16},
      {"I64", ckptd::kInt64},  {"I32", ckptd::kInt32},  {"I16", ckptd::kInt16},  {"I8", ckptd::kInt8},
      {"U64", ckptd::kUint64}, {"U32", ckptd::kUint32}, {"U16", ckptd::kUint16}, {"U8", ckptd::kUint8},
      {"BOOL", ckptd::kBool}};
  const auto it = kTypes.find(name);
  if (it == kTypes.end()) {
    return absl::UnimplementedError(absl::StrCat("safetensors dtype ", name, " has no TensorFlow type"));
  }
  return it->second;
}

// One safetensors file's tensors, checked as the reference reader checks them: the
// header's size and JSON, each tensor's byte count against its shape and dtype, and
// offsets that tile the data section exactly. *data_start: where the data begins.
absl::StatusOr<std::vector<ImportedTensor>> ReadSafetensorsHeader(ckptd::RandomAccessFile& file,
                                                                  const std::string& path, int shard,
                                                                  uint64_t* data_start) {
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a safetensors file: ", why));
  };
  if (file.Size() < 8) return bad("shorter than its 8-byte header size");
  char size_bytes[8];
  RETURN_IF_ERROR(file.Read(0, 8, size_bytes));
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = header_size << 8 | static_cast<uint8_t>(size_bytes[i]);
  if (header_size > kMaxSafetensorsHeader || 8 + header_size > file.Size()) {
    return bad(absl::StrCat("header of ", header_size, " bytes"));
  }
  std::string text(header_size, '\0');
  RETURN_IF_ERROR(file.Read(8, header_size, text.data()));
  const nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) return bad("its header is not a JSON object");
  *data_start = 8 + header_size;
  const uint64_t data_bytes = file.Size() - *data_start;
  std::vector<ImportedTensor> out;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    if (absl::StartsWith(name, ckptd::kReservedNamePrefix)) {
      return bad(
          absl::StrCat("tensor '", name, "' takes ckptd's reserved prefix ", ckptd::kReservedNamePrefix));
    }
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets") || !info["dtype"].is_string() || !info["shape"].is_array() ||
        !info["data_offsets"].is_array() || info["data_offsets"].size() != 2) {
      return bad(absl::StrCat("tensor '", name, "' lacks dtype, shape or data_offsets"));
    }
    ImportedTensor t{.name = name, .shard = shard};
    ASSIGN_OR_RETURN(t.dtype, DtypeOfSafetensors(info["dtype"].get<std::string>()));
    for (const auto& d : info["shape"]) {
      if (!d.is_number_unsigned()) return bad(absl::StrCat("tensor '", name, "' has a bad shape"));
      t.shape.push_back(d.get<int64_t>());
    }
    if (!info["data_offsets"][0].is_number_unsigned() || !info["data_offsets"][1].is_number_unsigned()) {
      return bad(absl::StrCat("tensor '", name, "' has bad data_offsets"));
    }
    t.begin = info["data_offsets"][0].get<uint64_t>();
    t.end = info["data_offsets"][1].get<uint64_t>();
    int64_t elements = 0;
    RETURN_IF_ERROR(ckptd::CheckShape(t.shape, &elements));
    if (t.end < t.begin || t.end > data_bytes ||
        t.end - t.begin != static_cast<uint64_t>(elements) * ckptd::DataTypeSize(t.dtype)) {
      return bad(absl::StrCat("tensor '", name, "': data_offsets [", t.begin, ", ", t.end, ") do not hold ",
                              elements, " ", info["dtype"].get<std::string>(),
                              " element(s) inside the file"));
    }
    out.push_back(std::move(t));
  }
  std::vector<ImportedTensor> by_offset = out;
  std::sort(by_offset.begin(), by_offset.end(),
            [](const ImportedTensor& a, const ImportedTensor& b) { return a.begin < b.begin; });
  uint64_t expected = 0;
  for (const ImportedTensor& t : by_offset) {
    if (t.begin != expected) return bad(absl::StrCat("tensor '", t.name, "' leaves a gap or overlaps"));
    expected = t.end;
  }
  if (expected != data_bytes) return bad("bytes after the last tensor");
  return out;
}

// The safetensors files SRC names, in shard order: a file, a directory holding
// model.safetensors, or one holding model.safetensors.index.json and its shards.
absl::StatusOr<std::vector<std::string>> SafetensorsFiles(ckptd::FileSystem* fs, const std::string& src) {
  if (!fs->IsDirectory(src)) return std::vector<std::string>{src};
  const std::string index_path = ckptd::JoinPath(src, "model.safetensors.index.json");
  if (!fs->Exists(index_path)) return std::vector<std::string>{ckptd::JoinPath(src, "model.safetensors")};
  ASSIGN_OR_RETURN(std::string text, fs->ReadFileToString(index_path, kMaxSafetensorsHeader));
  const nlohmann::json index = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": no weight_map"));
  }
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string() || absl::StrContains(file.get<std::string>(), "/")) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor '", name, "' names a bad file"));
    }
    files.insert(file.get<std::string>());
  }
  std::vector<std::string> out;
  for (const std::string& f : files) out.push_back(ckptd::JoinPath(src, f));
  return out;
}

bool LooksLikeSafetensors(ckptd::FileSystem* fs, const std::string& src) {
  if (absl::EndsWith(src, ".safetensors")) return true;
  return fs->IsDirectory(src) && (fs->Exists(ckptd::JoinPath(src, "model.safetensors")) ||
                                  fs->Exists(ckptd::JoinPath(src, "model.safetensors.index.json")));
}

// Writes each safetensors file as one data shard of a new bundle in `dir`; returns
// the index bytes and fills `meta` with the tensors and files.
absl::StatusOr<std::string> WriteFromSafetensors(ckptd::FileSystem* fs, const std::vector<std::string>& files,
                                                 const std::string& dir, ckptd::CheckpointMeta* meta,
                                                 Progress* progress) {
  const int shards = static_cast<int>(files.size());
  std::vector<std::vector<ImportedTensor>> per_file;
  std::vector<uint64_t> data_start(files.size());
  std::set<std::string> seen;
  int64_t total = 0, done = 0;
  std::vector<std::unique_ptr<ckptd::RandomAccessFile>> inputs;
  for (int k = 0; k < shards; ++k) {
    ASSIGN_OR_RETURN(std::unique_ptr<ckptd::RandomAccessFile> in, fs->NewRandomAccessFile(files[k]));
    ASSIGN_OR_RETURN(std::vector<ImportedTensor> tensors,
                     ReadSafetensorsHeader(*in, files[k], k, &data_start[k]));
    for (const ImportedTensor& t : tensors) {
      if (!seen.insert(t.name).second) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' appears in two files"));
      }
      total += static_cast<int64_t>(t.end - t.begin);
    }
    per_file.push_back(std::move(tensors));
    inputs.push_back(std::move(in));
  }
  ckptd::IndexBuilder index(shards);
  std::string bytes;
  for (int k = 0; k < shards; ++k) {
    const std::string path = ckptd::DataPath(ckptd::CheckpointStore::Prefix(dir), k, shards);
    ASSIGN_OR_RETURN(std::unique_ptr<ckptd::DataFileWriter> writer, ckptd::DataFileWriter::Create(fs, path));
    for (const ImportedTensor& t : per_file[k]) {
      bytes.resize(t.end - t.begin);
      RETURN_IF_ERROR(inputs[k]->Read(data_start[k] + t.begin, bytes.size(), bytes.data()));
      const int64_t elements = ckptd::Box::Full(t.shape).NumElements();
      ASSIGN_OR_RETURN(ckptd::DataFileWriter::Written written, writer->Append(t.dtype, elements, bytes));
      ckptd::tf::BundleEntryProto entry;
      entry.set_shard_id(k);
      entry.set_offset(written.offset);
      entry.set_size(static_cast<int64_t>(bytes.size()));
      entry.set_crc32c(written.crc32c);
      const ckptd::Box full = ckptd::Box::Full(t.shape);
      RETURN_IF_ERROR(index.AddTensor(t.name, t.dtype, t.shape, {{full, entry}}));
      meta->tensors.push_back({.name = t.name,
                               .dtype = ckptd::DataTypeName(t.dtype),
                               .shape = t.shape,
                               .boxes = {{.box = full, .writer = k}}});
      done += static_cast<int64_t>(bytes.size());
      if (progress != nullptr) progress->Update(done, total);
    }
    RETURN_IF_ERROR(writer->Finish());
    meta->hosts.push_back({.rank = k, .file = path.substr(path.rfind('/') + 1), .bytes = writer->size()});
  }
  meta->num_hosts = shards;
  return index.Finish();
}

// Copies a TF bundle's files into `dir` under the step's prefix (the index holds no
// file names, only shard numbers); fills `meta` from its index.
absl::Status CopyBundle(ckptd::FileSystem* fs, const ckptd::BundleReader& source, const std::string& dir,
                        ckptd::CheckpointMeta* meta, Progress* progress) {
  const int shards = source.header().num_shards();
  const std::string prefix = ckptd::CheckpointStore::Prefix(dir);
  std::vector<std::pair<std::string, std::string>> copies = {
      {ckptd::IndexPath(source.prefix()), ckptd::IndexPath(prefix)}};
  int64_t total = 0, done = 0;
  for (int k = 0; k < shards; ++k) {
    copies.emplace_back(source.DataFile(k), ckptd::DataPath(prefix, k, shards));
    ASSIGN_OR_RETURN(uint64_t size, fs->FileSize(source.DataFile(k)));
    total += static_cast<int64_t>(size);
    meta->hosts.push_back(
        {.rank = k, .file = ckptd::DataPath("ckpt", k, shards), .bytes = static_cast<int64_t>(size)});
  }
  std::string buffer(kCopyChunk, '\0');
  for (const auto& [from, to] : copies) {
    ASSIGN_OR_RETURN(std::unique_ptr<ckptd::RandomAccessFile> in, fs->NewRandomAccessFile(from));
    ASSIGN_OR_RETURN(std::unique_ptr<ckptd::WritableFile> out, fs->NewWritableFile(to));
    for (uint64_t offset = 0; offset < in->Size(); offset += kCopyChunk) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kCopyChunk, in->Size() - offset));
      RETURN_IF_ERROR(in->Read(offset, n, buffer.data()));
      RETURN_IF_ERROR(out->Append(absl::string_view(buffer.data(), n)));
      if (to != ckptd::IndexPath(prefix)) done += static_cast<int64_t>(n);
      if (progress != nullptr && total > 0) progress->Update(done, total);
    }
    RETURN_IF_ERROR(out->Sync());
    RETURN_IF_ERROR(out->Close());
  }
  for (const std::string& name : source.TensorNames()) {
    ASSIGN_OR_RETURN(ckptd::TensorInfo info, source.Lookup(name));
    ckptd::CheckpointMeta::Tensor tensor{
        .name = name, .dtype = ckptd::DataTypeName(info.dtype), .shape = info.shape};
    for (const ckptd::SavedPiece& p : info.pieces) {
      tensor.boxes.push_back({.box = p.box, .writer = p.entry.shard_id()});
    }
    meta->tensors.push_back(std::move(tensor));
  }
  meta->num_hosts = shards;
  return absl::OkStatus();
}

// Writes the step into `temp`: the source's tensors (a TF bundle `source`, else the
// safetensors `files`), checked as written (every checksum of the new step), then
// ckptd.json last, whose directory sync makes every file above durable.
absl::Status WriteImportedStep(ckptd::FileSystem* fs, ckptd::BundleReader* source,
                               const std::vector<std::string>& files, const std::string& temp,
                               absl::Time started, ckptd::CheckpointMeta* meta, Progress* shown) {
  if (source == nullptr) {
    ASSIGN_OR_RETURN(std::string index, WriteFromSafetensors(fs, files, temp, meta, shown));
    RETURN_IF_ERROR(fs->WriteFileAtomically(ckptd::IndexPath(ckptd::CheckpointStore::Prefix(temp)), index));
  } else {
    RETURN_IF_ERROR(CopyBundle(fs, *source, temp, meta, shown));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ckptd::BundleReader> written,
                   ckptd::BundleReader::Open(fs, ckptd::CheckpointStore::Prefix(temp)));
  std::vector<std::string> problems;
  int64_t bytes = 0;
  written->VerifyAll(&problems, &bytes);
  if (!problems.empty())
    return absl::DataLossError(absl::StrCat("the copy does not verify: ", problems.front()));
  meta->created_unix = absl::ToUnixSeconds(absl::Now());
  meta->commit_seconds = absl::ToDoubleSeconds(absl::Now() - started);
  for (const auto& h : meta->hosts) meta->bytes_per_host.push_back(h.bytes);
  return fs->WriteFileAtomically(ckptd::JoinPath(temp, ckptd::kCheckpointMetaFile), meta->ToJson());
}

}  // namespace

int Import(const Context& ctx, const std::string& src, const std::string& run_dir_arg, int64_t step,
           bool quiet, bool as_json) {
  ckptd::FileSystem* fs = ckptd::PosixFileSystem();
  const absl::Time started = absl::Now();
  const std::string run_dir = TrimSlashes(run_dir_arg);
  const std::string run = run_dir.substr(run_dir.rfind('/') + 1);
  if (run.empty() || run == "." || run == ".." || absl::StartsWith(run, ".")) {
    return Error(
        absl::InvalidArgumentError(absl::StrCat(run_dir_arg, ": want a run directory <root>/<run>")));
  }
  if (step < 0) return Error(absl::InvalidArgumentError("--step must be 0 or more"));
  // What import writes is as private as the daemon's own steps beside it.
  const ckptd::CreateModes modes = ckptd::ModesBeneath(ckptd::DirName(run_dir), /*private_at_least=*/true);
  const std::unique_ptr<ckptd::FileSystem> writer = ckptd::PosixFileSystemCreating(modes.file);
  const ckptd::CheckpointStore store(writer.get(), ckptd::DirName(run_dir));
  if (fs->Exists(store.StepDir(run, step))) {
    return Error(absl::AlreadyExistsError(
        absl::StrCat(store.StepDir(run, step), " exists: a committed step is never replaced")));
  }
  // Read the source before anything is written: a bad source leaves nothing behind.
  const bool safetensors = LooksLikeSafetensors(fs, src);
  std::unique_ptr<ckptd::BundleReader> source;
  std::vector<std::string> files;
  if (safetensors) {
    auto listed = SafetensorsFiles(fs, src);
    if (!listed.ok()) return Error(listed.status());
    files = std::move(*listed);
  } else {
    std::string prefix;
    auto reader = OpenCheckpoint(ctx, src, &prefix);
    if (!reader.ok()) return Error(reader.status());
    source = std::move(*reader);
    std::vector<std::string> problems;
    int64_t bytes = 0;
    source->VerifyAll(&problems, &bytes);
    if (!problems.empty()) {
      return Error(absl::DataLossError(absl::StrCat("the source does not verify: ", problems.front())));
    }
  }
  ckptd::CheckpointMeta meta{.version = ckptd::wire::kVersion, .run = run, .step = step};
  meta.imported_from =
      safetensors ? absl::StrCat("safetensors model (", files.size(), " file(s))") : "TensorFlow checkpoint";
  // A temp directory of its own (a commit's temp name with a suffix, so gc and the
  // daemons treat a crashed import's leftovers as a crashed commit's).
  const std::string temp = store.TempDir(run, step) + ".import";
  Progress progress("import");
  absl::Status s =
      store.BeginStep(run, step, ".import", modes.dir, ckptd::CheckpointStore::Begin::kFresh).status();
  Progress* shown = quiet || as_json ? nullptr : &progress;
  if (s.ok())
    s = WriteImportedStep(writer.get(), safetensors ? nullptr : source.get(), files, temp, started, &meta,
                          shown);
  bool renamed = false;
  if (s.ok()) s = store.PublishStep(temp, run, step, /*sync_contents=*/false, &renamed);
  if (!s.ok()) {
    if (!renamed) fs->DeleteRecursively(temp).IgnoreError();
    return Error(s);
  }
  int64_t bytes = 0;
  for (const auto& h : meta.hosts) bytes += h.bytes;
  if (as_json) {
    PrintJson({{"run_dir", run_dir},
               {"step", step},
               {"path", store.StepDir(run, step)},
               {"tensors", meta.tensors.size()},
               {"bytes", bytes},
               {"source", safetensors ? "safetensors" : "tensorflow"}});
  } else {
    std::printf("imported %zu tensor(s), %s, from %s as step %lld of %s\n", meta.tensors.size(),
                HumanBytes(static_cast<double>(bytes)).c_str(), src.c_str(), static_cast<long long>(step),
                run_dir.c_str());
  }
  return kOk;
}

}  // namespace ckptctl
