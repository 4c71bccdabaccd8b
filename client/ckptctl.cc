// ckptctl: the operator's tool.
//
// Offline commands (ls, inspect, verify, export, diff, gc) read checkpoint files
// directly through the bundle format library and work on any TensorFlow V2
// checkpoint. Online commands (status, wait, restore) talk to a running daemon.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "ckptd/client.h"
#include "client/tensor_export.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/bundle/checkpoint_meta.h"
#include "daemon/bundle/crc32c.h"
#include "daemon/layout/cast.h"
#include "daemon/store/checkpoint_store.h"

namespace {

using ckptd::BundleReader;
using json = nlohmann::json;

constexpr char kExitCodes[] =
    "Exit codes: 0 success (diff: no differences); 1 a problem was found (verify: a checksum or file "
    "is bad; diff: the checkpoints differ; wait: the step failed); 2 usage, input or connection error; "
    "3 wait timed out.";
enum ExitCode { kOk = 0, kFound = 1, kError = 2, kTimedOut = 3 };

int Error(const absl::Status& status) {
  std::cerr << "ckptctl: " << status.message() << std::endl;
  return kError;
}

// Names in a checkpoint are bytes; invalid UTF-8 is printed as U+FFFD, never a crash.
void PrintJson(const json& j) {
  std::cout << j.dump(1, ' ', false, json::error_handler_t::replace) << std::endl;
}

// Accepts a bundle prefix, a step directory (holding ckpt.index), a run directory
// (holding TF's `checkpoint` state file, which names the newest prefix) or a
// directory holding exactly one PREFIX.index.
absl::StatusOr<std::string> ResolvePrefix(ckptd::FileSystem* fs, const std::string& arg) {
  if (fs->Exists(ckptd::IndexPath(arg))) return arg;
  if (fs->IsDirectory(arg)) {
    const std::string in_dir = ckptd::CheckpointStore::Prefix(arg);
    if (fs->Exists(ckptd::IndexPath(in_dir))) return in_dir;
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
  ckptd::FileSystem* fs = ckptd::PosixFileSystem();
  auto prefix = ResolvePrefix(fs, arg);
  if (!prefix.ok()) return prefix.status();
  if (prefix_out != nullptr) *prefix_out = *prefix;
  return BundleReader::Open(fs, *prefix);
}

// ckptd.json beside a prefix, when the checkpoint is ours (and readable); else
// defaults (a checkpoint TensorFlow wrote has none).
ckptd::CheckpointMeta ReadMeta(const std::string& prefix) {
  auto text = ckptd::PosixFileSystem()->ReadFileToString(
      ckptd::JoinPath(ckptd::DirName(prefix), ckptd::kCheckpointMetaFile), 1 << 28);
  if (!text.ok()) return ckptd::CheckpointMeta{};
  return ckptd::CheckpointMeta::FromJson(*text).value_or(ckptd::CheckpointMeta{});
}

std::string ShapeString(const ckptd::Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f %s", bytes, units[u]) : absl::StrFormat("%.1f %s", bytes, units[u]);
}

std::string LocalTime(double unix_seconds) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixSeconds(static_cast<int64_t>(unix_seconds)),
                          absl::LocalTimeZone());
}

// Names matching `pattern` (ECMAScript regex, searched anywhere in the name; empty
// matches all), in index order.
absl::StatusOr<std::vector<std::string>> SelectNames(const BundleReader& reader, const std::string& pattern) {
  std::vector<std::string> names = reader.TensorNames();
  if (pattern.empty()) return names;
  std::regex re;
  try {
    re = std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return absl::InvalidArgumentError(absl::StrCat("--tensors '", pattern, "': ", e.what()));
  }
  std::vector<std::string> out;
  for (const std::string& n : names) {
    if (std::regex_search(n, re)) out.push_back(n);
  }
  return out;
}

// A run directory <root>/<run> as the store that holds it and the run's name.
struct RunDir {
  std::string run;
  ckptd::CheckpointStore store;
};

absl::StatusOr<RunDir> OpenRunDir(const std::string& dir) {
  ckptd::FileSystem* fs = ckptd::PosixFileSystem();
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  if (!fs->IsDirectory(trimmed)) return absl::NotFoundError(absl::StrCat(dir, " is not a directory"));
  return RunDir{trimmed.substr(trimmed.rfind('/') + 1), ckptd::CheckpointStore(fs, ckptd::DirName(trimmed))};
}

// --- ls ---------------------------------------------------------------------------

int Ls(const std::string& dir, bool as_json) {
  ckptd::FileSystem* fs = ckptd::PosixFileSystem();
  auto run_dir = OpenRunDir(dir);
  if (!run_dir.ok()) return Error(run_dir.status());
  const std::string& run = run_dir->run;
  const ckptd::CheckpointStore& store = run_dir->store;
  auto steps = store.ListSteps(run);
  if (!steps.ok()) return Error(steps.status());
  // The newest committed step is what `latest` restores (the state file names it).
  const int64_t latest = steps->empty() ? -1 : steps->back();
  json out = json::array();
  if (!as_json) std::printf("%12s  %10s  %-19s  %9s  %s\n", "STEP", "SIZE", "CREATED", "COMMIT", "PATH");
  for (int64_t step : *steps) {
    const std::string path = store.StepDir(run, step);
    int64_t bytes = 0;
    if (auto names = fs->ListDir(path); names.ok()) {
      for (const auto& n : *names) bytes += fs->FileSize(ckptd::JoinPath(path, n)).value_or(0);
    }
    const ckptd::CheckpointMeta meta = ReadMeta(ckptd::CheckpointStore::Prefix(path));
    const double created = static_cast<double>(meta.created_unix);
    const double commit = meta.commit_seconds;
    if (as_json) {
      json j = {{"step", step}, {"path", path}, {"bytes", bytes}, {"latest", step == latest}};
      if (created > 0) j["created_unix"] = created;
      if (commit > 0) j["commit_seconds"] = commit;
      out.push_back(j);
    } else {
      std::printf("%12lld  %10s  %-19s  %8.2fs  %s%s\n", static_cast<long long>(step),
                  HumanBytes(bytes).c_str(), created > 0 ? LocalTime(created).c_str() : "-", commit,
                  path.c_str(), step == latest ? "  (latest)" : "");
    }
  }
  if (as_json) PrintJson(out);
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
    PrintJson(out);
  }
  return kOk;
}

// --- verify -----------------------------------------------------------------------

// A progress bar on a terminal; a plain line every 10% when output is piped.
class Progress {
 public:
  explicit Progress(std::string what) : what_(std::move(what)), tty_(::isatty(2) == 1) {}
  void Update(int64_t done, int64_t total) {
    const int percent = total == 0 ? 100 : static_cast<int>(done * 100 / total);
    if (tty_) {
      const int filled = percent * 30 / 100;
      std::fprintf(stderr, "\r%s [%s%s] %3d%% %s / %s", what_.c_str(), std::string(filled, '#').c_str(),
                   std::string(30 - filled, ' ').c_str(), percent, HumanBytes(done).c_str(),
                   HumanBytes(total).c_str());
      if (done == total) std::fprintf(stderr, "\n");
    } else if (percent / 10 > last_tenth_) {
      last_tenth_ = percent / 10;
      std::fprintf(stderr, "%s: %d%% (%s of %s)\n", what_.c_str(), percent, HumanBytes(done).c_str(),
                   HumanBytes(total).c_str());
    }
  }

 private:
  std::string what_;
  bool tty_;
  int last_tenth_ = -1;
};

int Verify(const std::string& arg, bool as_json, bool quiet) {
  std::string prefix;
  auto reader = OpenCheckpoint(arg, &prefix);
  if (!reader.ok()) {
    if (prefix.empty()) return Error(reader.status());  // no checkpoint there at all
    std::cerr << "ckptctl verify: " << reader.status().message() << std::endl;
    if (as_json)
      PrintJson({{"prefix", prefix}, {"ok", false}, {"problems", {std::string(reader.status().message())}}});
    return kFound;
  }
  std::vector<std::string> problems;
  int64_t bytes = 0;
  Progress progress("verify");
  const int checked = (*reader)->VerifyAll(&problems, &bytes, [&](int64_t done, int64_t total) {
    if (!quiet && !as_json) progress.Update(done, total);
  });
  if (as_json) {
    PrintJson({{"prefix", prefix},
               {"ok", problems.empty()},
               {"entries", checked},
               {"bytes", bytes},
               {"problems", problems}});
  } else {
    for (const std::string& line : problems) std::cerr << "FAIL " << line << std::endl;
    std::printf("%s: %d entries checked, %lld bytes, %zu problem(s)\n", prefix.c_str(), checked,
                static_cast<long long>(bytes), problems.size());
  }
  return problems.empty() ? kOk : kFound;
}

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

int Gc(const std::string& dir, int keep_last, int keep_every, bool dry_run, bool as_json) {
  auto run_dir = OpenRunDir(dir);
  if (!run_dir.ok()) return Error(run_dir.status());
  const std::string& run = run_dir->run;
  const ckptd::CheckpointStore& store = run_dir->store;
  auto removed = store.ApplyRetention(run, keep_last, keep_every, {}, dry_run);
  if (!removed.ok()) return Error(removed.status());
  auto kept = store.ListSteps(run);
  if (as_json) {
    PrintJson({{"dry_run", dry_run}, {"removed", *removed}, {"kept", kept.value_or(std::vector<int64_t>())}});
    return kOk;
  }
  for (int64_t step : *removed) {
    std::printf("%s step %lld\n", dry_run ? "would remove" : "removed", static_cast<long long>(step));
  }
  std::printf("%zu step(s) %s, %zu kept\n", removed->size(), dry_run ? "would be removed" : "removed",
              dry_run ? kept->size() - removed->size() : kept->size());
  return kOk;
}

// --- online commands --------------------------------------------------------------

struct DaemonFlags {
  std::string address;
  ckptd::TlsFiles tls;
  void AddTo(CLI::App* app) {
    app->add_option("--address", address, "daemon socket or host:port (default $CKPTD_ADDRESS)");
    app->add_option("--tls-cert", tls.cert, "client certificate (PEM) for a TCP address");
    app->add_option("--tls-key", tls.key, "client key (PEM)");
    app->add_option("--tls-ca", tls.ca, "CA certificate (PEM) the daemon's certificate must chain to");
  }
  absl::StatusOr<std::unique_ptr<ckptd::Client>> Connect() const {
    return ckptd::Client::Connect(address, absl::Seconds(5), tls.ca.empty() ? nullptr : &tls);
  }
};

json RankJson(const ckptd::v1::StatusResponse& s) {
  json pending = json::array();
  for (const auto& p : s.pending_steps()) pending.push_back({{"run", p.run()}, {"step", p.step()}});
  json runs = json::array();
  for (const auto& r : s.runs()) {
    json j = {{"run", r.run()}, {"last_committed_step", r.last_committed_step()}};
    if (r.last_commit_unix_seconds() > 0) {
      j["last_commit_unix_seconds"] = r.last_commit_unix_seconds();
      j["last_commit_seconds"] = r.last_commit_seconds();
    }
    runs.push_back(j);
  }
  return {{"rank", s.rank()},
          {"pid", s.pid()},
          {"version", s.version()},
          {"root", s.root()},
          {"pending_steps", pending},
          {"runs", runs},
          {"bytes_staged", s.bytes_staged()},
          {"bytes_in_flight", s.bytes_in_flight()},
          {"bytes_written", s.bytes_written()},
          {"peak_bytes_staged", s.peak_bytes_staged()},
          {"pooled_bytes", s.pooled_bytes()},
          {"staging_memory_limit", s.staging_memory_limit()},
          {"device_memory", s.device_memory()},
          {"device_to_host_bytes", s.device_to_host_bytes()},
          {"device_to_host_seconds", s.device_to_host_seconds()},
          {"host_to_device_bytes", s.host_to_device_bytes()},
          {"host_to_device_seconds", s.host_to_device_seconds()}};
}

int Status(const DaemonFlags& flags, bool as_json) {
  auto client = flags.Connect();
  if (!client.ok()) return Error(client.status());
  auto status = (*client)->Status();
  if (!status.ok()) return Error(status.status());
  // Every rank's report as the last coordination round gathered it; this daemon's
  // own entry is replaced by its live state.
  std::vector<ckptd::v1::StatusResponse> ranks(status->ranks().begin(), status->ranks().end());
  if (ranks.empty()) ranks.resize(1);
  if (status->rank() < static_cast<int>(ranks.size())) {
    ranks[status->rank()] = *status;
    ranks[status->rank()].clear_ranks();
  }
  if (as_json) {
    json out = {{"num_ranks", status->num_ranks()}, {"asked_rank", status->rank()}, {"ranks", json::array()}};
    if (status->ranks_as_of_unix_seconds() > 0)
      out["ranks_as_of_unix_seconds"] = status->ranks_as_of_unix_seconds();
    if (!status->tcp_address().empty()) out["tcp_address"] = status->tcp_address();
    for (const auto& r : ranks) out["ranks"].push_back(RankJson(r));
    PrintJson(out);
    return kOk;
  }
  std::printf("ckptd %s: %d rank(s), root %s\n", status->version().c_str(), status->num_ranks(),
              status->root().c_str());
  std::printf("%4s %8s %10s %10s %10s %8s  %s\n", "RANK", "PID", "STAGED", "IN FLIGHT", "WRITTEN", "PENDING",
              "LAST COMMIT");
  for (const auto& r : ranks) {
    std::vector<std::string> commits;
    for (const auto& run : r.runs()) {
      std::string c = absl::StrCat(run.run(), " step ", run.last_committed_step());
      if (run.last_commit_unix_seconds() > 0) {
        absl::StrAppend(&c, " at ", LocalTime(run.last_commit_unix_seconds()),
                        absl::StrFormat(" in %.2fs", run.last_commit_seconds()));
      }
      commits.push_back(c);
    }
    std::vector<std::string> pending;
    for (const auto& p : r.pending_steps()) pending.push_back(absl::StrCat(p.run(), ":", p.step()));
    std::printf("%4d %8lld %10s %10s %10s %8s  %s\n", r.rank(), static_cast<long long>(r.pid()),
                HumanBytes(r.bytes_staged()).c_str(), HumanBytes(r.bytes_in_flight()).c_str(),
                HumanBytes(r.bytes_written()).c_str(),
                pending.empty() ? "-" : absl::StrJoin(pending, ",").c_str(),
                commits.empty() ? "-" : absl::StrJoin(commits, "; ").c_str());
  }
  return kOk;
}

int Wait(const DaemonFlags& flags, const std::string& run, int64_t step, double timeout_seconds,
         bool as_json) {
  auto client = flags.Connect();
  if (!client.ok()) return Error(client.status());
  const absl::Time started = absl::Now();
  const absl::Status s = (*client)->Wait(run, step, absl::Seconds(timeout_seconds));
  const double waited = absl::ToDoubleSeconds(absl::Now() - started);
  if (as_json) {
    PrintJson({{"run", run},
               {"step", step},
               {"committed", s.ok()},
               {"waited_seconds", waited},
               {"error", std::string(s.message())}});
  } else if (s.ok()) {
    std::printf("run '%s' step %lld committed\n", run.c_str(), static_cast<long long>(step));
  } else {
    std::cerr << "ckptctl wait: " << s.message() << std::endl;
  }
  if (s.ok()) return kOk;
  // Our own deadline passing is a timeout; a step that failed its commit deadline
  // fails sooner, with a message naming the step.
  if (s.code() == absl::StatusCode::kDeadlineExceeded && waited >= timeout_seconds * 0.99) return kTimedOut;
  // The request itself was refused (a bad run name) or the daemon is gone; any other
  // error is the step's own outcome.
  const bool bad_request =
      s.code() == absl::StatusCode::kInvalidArgument && absl::StartsWith(s.message(), "run");
  if (bad_request || s.code() == absl::StatusCode::kUnavailable ||
      s.code() == absl::StatusCode::kPermissionDenied) {
    return kError;
  }
  return kFound;
}

int Restore(const DaemonFlags& flags, const std::string& run, std::optional<int64_t> step,
            const std::string& pattern, const std::string& out_dir, const std::string& dtype_name,
            bool as_json) {
  ckptd::FileSystem* fs = ckptd::PosixFileSystem();
  std::optional<int> dtype;
  if (!dtype_name.empty()) {
    dtype = ckptd::DataTypeFromName(dtype_name);
    if (!dtype.has_value())
      return Error(absl::InvalidArgumentError(absl::StrCat("--dtype: unknown '", dtype_name, "'")));
  }
  auto client = flags.Connect();
  if (!client.ok()) return Error(client.status());
  // The daemon says where the step lives; its index says which tensors there are.
  auto list = (*client)->ListCheckpoints(run);
  if (!list.ok()) return Error(list.status());
  const ckptd::v1::CheckpointInfo* chosen = nullptr;
  for (const auto& c : list->checkpoints()) {
    if (step.has_value() ? c.step() == *step : (chosen == nullptr || c.step() > chosen->step())) chosen = &c;
  }
  if (chosen == nullptr) {
    return Error(absl::NotFoundError(step.has_value()
                                         ? absl::StrCat("run '", run, "' has no committed step ", *step)
                                         : absl::StrCat("run '", run, "' has no committed step")));
  }
  auto reader = BundleReader::Open(fs, ckptd::CheckpointStore::Prefix(chosen->path()));
  if (!reader.ok()) return Error(reader.status());
  auto names = SelectNames(**reader, pattern);
  if (!names.ok()) return Error(names.status());
  if (absl::Status s = fs->CreateDirs(out_dir, 0755); !s.ok()) return Error(s);
  json files = json::array(), skipped = json::array();
  int64_t total = 0;
  for (const std::string& name : *names) {
    auto info = (*reader)->Lookup(name);
    if (!info.ok()) return Error(info.status());
    // NumPy has no bfloat16: ask the daemon for float32 unless told otherwise.
    int want = dtype.value_or(info->dtype == ckptd::kBfloat16 ? ckptd::kFloat : info->dtype);
    if (!ckptd::NpyHeader(want, {}).ok() || ckptd::DataTypeSize(info->dtype) == 0) {
      skipped.push_back({{"name", name}, {"dtype", ckptd::DataTypeName(info->dtype)}});
      if (!as_json)
        std::fprintf(stderr, "skipped %s: cannot write %s as .npy\n", name.c_str(),
                     ckptd::DataTypeName(info->dtype).c_str());
      continue;
    }
    std::string bytes(
        static_cast<size_t>(ckptd::Box::Full(info->shape).NumElements()) * ckptd::DataTypeSize(want), '\0');
    ckptd::RestoreTarget target;
    target.name = name;
    target.dtype = want;
    target.shape = info->shape;
    target.data = bytes.data();
    target.size = bytes.size();
    auto restored = (*client)->Restore(run, chosen->step(), {target});
    if (!restored.ok()) return Error(restored.status());
    const std::string path = ckptd::JoinPath(out_dir, ckptd::TensorFileName(name) + ".npy");
    absl::Status s = fs->CreateDirs(ckptd::DirName(path), 0755);
    if (s.ok()) s = ckptd::WriteNpy(fs, path, want, info->shape, bytes);
    if (!s.ok()) return Error(s);
    total += static_cast<int64_t>(bytes.size());
    files.push_back({{"name", name}, {"path", path}, {"dtype", ckptd::DataTypeName(want)}});
    if (!as_json) std::printf("%s -> %s\n", name.c_str(), path.c_str());
  }
  if (as_json) {
    PrintJson(
        {{"run", run}, {"step", chosen->step()}, {"files", files}, {"bytes", total}, {"skipped", skipped}});
  } else {
    std::printf("restored %zu tensor(s) of run '%s' step %lld through the daemon, %s, into %s\n",
                files.size(), run.c_str(), static_cast<long long>(chosen->step()), HumanBytes(total).c_str(),
                out_dir.c_str());
  }
  return kOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ckptctl: list, inspect, verify, export and restore ckptd (and any TensorFlow V2) checkpoints"};
  app.footer(kExitCodes);
  app.require_subcommand(1);
  bool as_json = false, quiet = false, dry_run = false;
  std::string target, second, pattern, out_dir, format = "npy", run, dtype_name;
  int keep_last = 0, keep_every = 0;
  int64_t step = -1;
  double timeout_seconds = 600;
  DaemonFlags daemon;
  const char* kCheckpointHelp = "checkpoint prefix, step directory or run directory (its newest step)";
  const char* kRegexHelp = "only tensors whose name matches this regular expression (ECMAScript, searched)";

  CLI::App* ls =
      app.add_subcommand("ls", "list a run's committed steps: size, creation time, commit time, latest");
  ls->add_option("DIR", target, "run directory (<root>/<run>)")->required();
  ls->add_flag("--json", as_json, "print JSON");

  CLI::App* inspect =
      app.add_subcommand("inspect", "show tensors: dtype, shape, slices, bytes, shard, layout, mesh");
  inspect->add_option("PREFIX", target, kCheckpointHelp)->required();
  inspect->add_option("--tensors", pattern, kRegexHelp);
  inspect->add_flag("--json", as_json, "print one JSON object");

  CLI::App* verify =
      app.add_subcommand("verify", "read every byte and check every checksum; exit 1 on any problem");
  verify->add_option("PREFIX", target, kCheckpointHelp)->required();
  verify->add_flag("--json", as_json, "print one JSON object");
  verify->add_flag("-q,--quiet", quiet, "no progress");

  CLI::App* exporter =
      app.add_subcommand("export", "write tensors as whole arrays: .npy files or one model.safetensors");
  exporter->add_option("PREFIX", target, kCheckpointHelp)->required();
  exporter
      ->add_option("--format", format,
                   "npy (one file per tensor; bfloat16 widened to float32) or safetensors")
      ->check(CLI::IsMember({"npy", "safetensors"}));
  exporter->add_option("--out", out_dir, "output directory (created)")->required();
  exporter->add_option("--tensors", pattern, kRegexHelp);
  exporter->add_flag("--json", as_json, "print JSON");

  CLI::App* diff =
      app.add_subcommand("diff", "tensors added, removed or changed (dtype, shape, checksum) from A to B");
  diff->add_option("A", target, kCheckpointHelp)->required();
  diff->add_option("B", second, kCheckpointHelp)->required();
  diff->add_option("--tensors", pattern, kRegexHelp);
  diff->add_flag("--json", as_json, "print JSON");

  CLI::App* gc =
      app.add_subcommand("gc", "apply retention to a run directory (never removes the newest step)");
  gc->add_option("DIR", target, "run directory (<root>/<run>)")->required();
  gc->add_option("--keep-last", keep_last, "keep the newest N committed steps")
      ->required()
      ->check(CLI::PositiveNumber);
  gc->add_option("--keep-every", keep_every, "also keep steps divisible by K")->check(CLI::NonNegativeNumber);
  gc->add_flag("--dry-run", dry_run, "only say what would be removed");
  gc->add_flag("--json", as_json, "print JSON");

  CLI::App* status =
      app.add_subcommand("status", "a running job, every rank: pending steps, bytes, last commit");
  daemon.AddTo(status);
  status->add_flag("--json", as_json, "print JSON");

  CLI::App* wait =
      app.add_subcommand("wait", "block until RUN STEP is committed on every host (exit 1 if it fails)");
  wait->add_option("RUN", run, "run name")->required();
  wait->add_option("STEP", step, "step")->required();
  wait->add_option("--timeout", timeout_seconds, "seconds to wait (exit 3 when they pass)")
      ->check(CLI::PositiveNumber);
  daemon.AddTo(wait);
  wait->add_flag("--json", as_json, "print JSON");

  CLI::App* restore = app.add_subcommand("restore", "restore tensors through the daemon into .npy files");
  restore->add_option("RUN", run, "run name")->required();
  restore->add_option("--step", step, "step (default: the newest committed)");
  restore->add_option("--tensors", pattern, kRegexHelp);
  restore->add_option("--out", out_dir, "output directory (created)")->required();
  restore->add_option(
      "--dtype", dtype_name,
      "restore float32/bfloat16/float16 tensors as float or half (default: as stored; bfloat16 as float)");
  daemon.AddTo(restore);
  restore->add_flag("--json", as_json, "print JSON");

  for (CLI::App* sub : app.get_subcommands({})) sub->footer(kExitCodes);
  CLI11_PARSE(app, argc, argv);
  if (ls->parsed()) return Ls(target, as_json);
  if (inspect->parsed()) return Inspect(target, pattern, as_json);
  if (verify->parsed()) return Verify(target, as_json, quiet);
  if (exporter->parsed()) return Export(target, format, out_dir, pattern, as_json);
  if (diff->parsed()) return Diff(target, second, pattern, as_json);
  if (gc->parsed()) return Gc(target, keep_last, keep_every, dry_run, as_json);
  if (status->parsed()) return Status(daemon, as_json);
  if (wait->parsed()) return Wait(daemon, run, step, timeout_seconds, as_json);
  if (restore->parsed()) {
    return Restore(daemon, run, step >= 0 ? std::optional<int64_t>(step) : std::nullopt, pattern, out_dir,
                   dtype_name, as_json);
  }
  return kError;
}
