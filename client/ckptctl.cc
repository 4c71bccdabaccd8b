// ckptctl: the operator's tool. Offline commands (ls, inspect, verify) read checkpoint
// files directly through the bundle format library and work on any TensorFlow V2
// checkpoint; online commands (status) talk to a running daemon. Exit codes: 0 ok,
// 1 verification found a problem, 2 usage or I/O error.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckptd/client.h"
#include "daemon/base/dtype.h"
#include "daemon/bundle/bundle.h"
#include "daemon/coord/checkpoint_store.h"

namespace {

using ckptd::BundleReader;

int Error(const absl::Status& status) {
  std::cerr << "ckptctl: " << status.message() << std::endl;
  return 2;
}

// Accepts a bundle prefix, a step directory (holding ckpt.index) or a run directory
// (holding TF's `checkpoint` state file, which names the newest prefix).
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
  }
  return absl::NotFoundError(absl::StrCat(arg, ": no checkpoint here (want PREFIX with PREFIX.index, a step "
                                          "directory, or a directory with a `checkpoint` file)"));
}

std::string ShapeString(const ckptd::Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
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

int Ls(const std::string& dir, bool json) {
  ckptd::FileSystem* fs = ckptd::PosixFileSystem();
  auto run_dir = OpenRunDir(dir);
  if (!run_dir.ok()) return Error(run_dir.status());
  const std::string& run = run_dir->run;
  const ckptd::CheckpointStore& store = run_dir->store;
  auto steps = store.ListSteps(run);
  if (!steps.ok()) return Error(steps.status());
  nlohmann::json out = nlohmann::json::array();
  for (int64_t step : *steps) {
    const std::string path = store.StepDir(run, step);
    int64_t bytes = 0;
    if (auto names = fs->ListDir(path); names.ok()) {
      for (const auto& n : *names) bytes += fs->FileSize(ckptd::JoinPath(path, n)).value_or(0);
    }
    if (json) {
      out.push_back({{"step", step}, {"path", path}, {"bytes", bytes}});
    } else {
      std::printf("%10lld  %12lld  %s\n", static_cast<long long>(step), static_cast<long long>(bytes), path.c_str());
    }
  }
  if (json) std::cout << out.dump(1) << std::endl;
  return 0;
}

int Inspect(const std::string& arg, bool json) {
  ckptd::FileSystem* fs = ckptd::PosixFileSystem();
  auto prefix = ResolvePrefix(fs, arg);
  if (!prefix.ok()) return Error(prefix.status());
  auto reader = BundleReader::Open(fs, *prefix);
  if (!reader.ok()) return Error(reader.status());
  // ckptd.json, when the checkpoint is ours, adds the mesh and each tensor's layout.
  std::string mesh;
  std::map<std::string, std::string> layouts;
  if (auto meta_text = fs->ReadFileToString(ckptd::JoinPath(ckptd::DirName(*prefix), "ckptd.json"), 1 << 28);
      meta_text.ok()) {
    const nlohmann::json meta = nlohmann::json::parse(*meta_text, nullptr, /*allow_exceptions=*/false);
    if (meta.is_object()) {
      mesh = meta.value("mesh", "");
      for (const auto& t : meta.value("tensors", nlohmann::json::array())) {
        if (t.contains("layout") && t["layout"].is_string()) layouts[t.value("name", "")] = t["layout"];
      }
    }
  }
  nlohmann::json entries = nlohmann::json::array();
  if (!json) {
    std::printf("%s: %d shard(s)\n", prefix->c_str(), (*reader)->header().num_shards());
    if (!mesh.empty()) std::printf("mesh: %s\n", mesh.c_str());
  }
  for (const std::string& name : (*reader)->TensorNames()) {
    auto info = (*reader)->Lookup(name);
    if (!info.ok()) return Error(info.status());
    const ckptd::tf::BundleEntryProto& e = *(*reader)->Find(name);
    nlohmann::json j = {{"key", name},          {"dtype", ckptd::DataTypeName(info->dtype)},
                        {"shape", info->shape}, {"shard", e.shard_id()},
                        {"offset", e.offset()}, {"size", e.size()}};
    if (e.slices_size() > 0) {
      nlohmann::json slices = nlohmann::json::array();
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
    if (json) {
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
        std::printf("      slice %-28s shard %d offset %lld size %lld\n", p.box.ToSliceString(info->shape).c_str(),
                    p.entry.shard_id(), static_cast<long long>(p.entry.offset()),
                    static_cast<long long>(p.entry.size()));
      }
    }
  }
  if (json) {
    nlohmann::json out = {{"num_shards", (*reader)->header().num_shards()}, {"entries", entries}};
    if (!mesh.empty()) out["mesh"] = mesh;
    std::cout << out.dump(1) << std::endl;
  }
  return 0;
}

int Verify(const std::string& arg) {
  ckptd::FileSystem* fs = ckptd::PosixFileSystem();
  auto prefix = ResolvePrefix(fs, arg);
  if (!prefix.ok()) return Error(prefix.status());
  auto reader = BundleReader::Open(fs, *prefix);
  if (!reader.ok()) {
    std::cerr << "ckptctl verify: " << reader.status().message() << std::endl;
    return 1;
  }
  std::vector<std::string> problem_lines;
  int64_t bytes = 0;
  const int checked = (*reader)->VerifyAll(&problem_lines, &bytes);
  for (const std::string& line : problem_lines) std::cerr << "FAIL " << line << std::endl;
  const int problems = static_cast<int>(problem_lines.size());
  std::printf("%s: %d entries checked, %lld bytes, %d problem(s)\n", prefix->c_str(), checked,
              static_cast<long long>(bytes), problems);
  return problems == 0 ? 0 : 1;
}

int Gc(const std::string& dir, int keep_last, int keep_every, bool dry_run, bool json) {
  auto run_dir = OpenRunDir(dir);
  if (!run_dir.ok()) return Error(run_dir.status());
  const std::string& run = run_dir->run;
  const ckptd::CheckpointStore& store = run_dir->store;
  auto removed = store.ApplyRetention(run, keep_last, keep_every, {}, dry_run);
  if (!removed.ok()) return Error(removed.status());
  auto kept = store.ListSteps(run);
  if (json) {
    nlohmann::json out = {{"dry_run", dry_run}, {"removed", *removed}, {"kept", kept.value_or(std::vector<int64_t>())}};
    std::cout << out.dump(1) << std::endl;
    return 0;
  }
  for (int64_t step : *removed) std::printf("%s step %lld\n", dry_run ? "would remove" : "removed", static_cast<long long>(step));
  std::printf("%zu step(s) %s, %zu kept\n", removed->size(), dry_run ? "would be removed" : "removed",
              dry_run ? kept->size() - removed->size() : kept->size());
  return 0;
}

int Status(const std::string& address, const ckptd::TlsFiles& tls, bool json) {
  auto client = ckptd::Client::Connect(address, absl::Seconds(5), tls.ca.empty() ? nullptr : &tls);
  if (!client.ok()) return Error(client.status());
  auto status = (*client)->Status();
  if (!status.ok()) return Error(status.status());
  nlohmann::json pending = nlohmann::json::array();
  for (const auto& p : status->pending_steps()) pending.push_back({{"run", p.run()}, {"step", p.step()}});
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& r : status->runs()) runs.push_back({{"run", r.run()}, {"last_committed_step", r.last_committed_step()}});
  nlohmann::json out = {{"rank", status->rank()},
                        {"num_ranks", status->num_ranks()},
                        {"version", status->version()},
                        {"pid", status->pid()},
                        {"root", status->root()},
                        {"pending_steps", pending},
                        {"runs", runs},
                        {"bytes_staged", status->bytes_staged()},
                        {"bytes_written", status->bytes_written()}};
  std::cout << (json ? out.dump(1) : out.dump(2)) << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ckptctl: list, inspect and verify ckptd (and any TensorFlow V2) checkpoints"};
  app.require_subcommand(1);
  bool json = false;
  std::string target, address;

  CLI::App* ls = app.add_subcommand("ls", "list the committed steps of a run directory");
  ls->add_option("DIR", target, "run directory (<root>/<run>)")->required();
  ls->add_flag("--json", json, "print JSON");

  CLI::App* inspect = app.add_subcommand("inspect", "show every tensor: dtype, shape, slices, bytes, shard");
  inspect->add_option("PREFIX", target, "checkpoint prefix, step directory or run directory")->required();
  inspect->add_flag("--json", json, "print one JSON object");

  CLI::App* verify = app.add_subcommand("verify", "check every checksum; exit 1 naming any mismatch");
  verify->add_option("PREFIX", target, "checkpoint prefix, step directory or run directory")->required();

  CLI::App* gc = app.add_subcommand("gc", "apply retention to a run directory (never removes the newest step)");
  int keep_last = 0, keep_every = 0;
  bool dry_run = false;
  gc->add_option("DIR", target, "run directory (<root>/<run>)")->required();
  gc->add_option("--keep-last", keep_last, "keep the newest N committed steps")->required()->check(CLI::PositiveNumber);
  gc->add_option("--keep-every", keep_every, "also keep steps divisible by K")->check(CLI::NonNegativeNumber);
  gc->add_flag("--dry-run", dry_run, "only say what would be removed");
  gc->add_flag("--json", json, "print JSON");

  CLI::App* status = app.add_subcommand("status", "ask a running daemon for its state");
  status->add_option("--address", address, "daemon socket (default $CKPTD_ADDRESS)");
  status->add_flag("--json", json, "print compact JSON");
  ckptd::TlsFiles tls;
  status->add_option("--tls-cert", tls.cert, "client certificate (PEM) for a TCP address");
  status->add_option("--tls-key", tls.key, "client key (PEM)");
  status->add_option("--tls-ca", tls.ca, "CA certificate (PEM) the daemon's certificate must chain to");

  CLI11_PARSE(app, argc, argv);
  if (ls->parsed()) return Ls(target, json);
  if (inspect->parsed()) return Inspect(target, json);
  if (verify->parsed()) return Verify(target);
  if (gc->parsed()) return Gc(target, keep_last, keep_every, dry_run, json);
  if (status->parsed()) return Status(address, tls, json);
  return 2;
}
