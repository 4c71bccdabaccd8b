// ckptctl's online commands: everything they learn comes through the daemon's API.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/ckptctl/commands.h"
#include "client/ckptctl/daemon_file_system.h"
#include "client/tensor_export.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "daemon/base/units.h"
#include "daemon/bundle/checkpoint_meta.h"
#include "daemon/io/file_system.h"
#include "daemon/layout/cast.h"

namespace ckptctl {
namespace {

json GatheringJson(const ckptd::v1::StatusResponse& s) {
  json out = json::array();
  for (const auto& g : s.gathering()) {
    out.push_back(
        {{"run", g.run()},
         {"step", g.step()},
         {"trainer_count", g.trainer_count()},
         {"trainers_staged", g.trainers_staged()},
         {"missing_trainers", std::vector<int>(g.missing_trainers().begin(), g.missing_trainers().end())},
         {"deadline_unix_seconds", g.deadline_unix_seconds()}});
  }
  return out;
}

double UptimeSeconds(const ckptd::v1::StatusResponse& s) {
  if (s.started_unix_seconds() <= 0) return 0;  // a daemon older than the field
  return std::max(0.0, absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()) - s.started_unix_seconds());
}

// "12s", "4m 3s", "2h 5m", "3d 4h": the two largest units are enough to read.
std::string UptimeText(const ckptd::v1::StatusResponse& s) {
  if (s.started_unix_seconds() <= 0) return "-";
  const int64_t total = static_cast<int64_t>(UptimeSeconds(s));
  const int64_t days = total / 86400, hours = total / 3600 % 24, minutes = total / 60 % 60,
                seconds = total % 60;
  if (days > 0) return absl::StrCat(days, "d ", hours, "h");
  if (hours > 0) return absl::StrCat(hours, "h ", minutes, "m");
  if (minutes > 0) return absl::StrCat(minutes, "m ", seconds, "s");
  return absl::StrCat(seconds, "s");
}

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
  json kept = json::array();
  for (const auto& k : s.memory_steps())
    kept.push_back({{"run", k.run()}, {"step", k.step()}, {"bytes", k.bytes()}});
  return {{"rank", s.rank()},
          {"metrics_address", s.metrics_address()},
          {"started_unix_seconds", s.started_unix_seconds()},
          {"uptime_seconds", UptimeSeconds(s)},
          {"root_free_bytes", s.root_free_bytes()},
          {"memory_steps_limit", s.memory_steps_limit()},
          {"memory_steps", kept},
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
          {"host_to_device_seconds", s.host_to_device_seconds()},
          {"restore_storage_bytes_read", s.restore_storage_bytes_read()},
          {"restore_bytes_delivered", s.restore_bytes_delivered()},
          {"restore_peer_bytes_received", s.restore_peer_bytes_received()},
          {"read_cache_hit_bytes", s.read_cache_hit_bytes()},
          {"read_cache_bytes", s.read_cache_bytes()}};
}

}  // namespace

absl::StatusOr<std::string> DaemonPrefix(const DaemonFlags& flags, const std::string& run,
                                         std::optional<int64_t> step,
                                         std::unique_ptr<ckptd::Client>* client) {
  auto connected = flags.Connect();
  if (!connected.ok()) return connected.status();
  *client = *std::move(connected);
  auto list = (*client)->ListCheckpoints(run, flags.Left(absl::Seconds(30)));
  if (!list.ok()) return list.status();
  std::optional<int64_t> chosen;
  for (const auto& c : list->checkpoints()) {
    if (step.has_value() ? c.step() == *step : c.step() > chosen.value_or(-1)) chosen = c.step();
  }
  if (!chosen.has_value()) {
    return absl::NotFoundError(step.has_value()
                                   ? absl::StrCat("run '", run, "' has no committed step ", *step)
                                   : absl::StrCat("run '", run, "' has no committed step"));
  }
  return DaemonFileSystem::Prefix(run, *chosen);
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> DaemonSteps(
    const DaemonFlags& flags, const std::string& run, std::unique_ptr<ckptd::Client>* client) {
  ASSIGN_OR_RETURN(*client, flags.Connect());
  ASSIGN_OR_RETURN(ckptd::v1::ListCheckpointsResponse list,
                   (*client)->ListCheckpoints(run, flags.Left(absl::Seconds(30))));
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const auto& c : list.checkpoints())
    steps.emplace_back(c.step(), DaemonFileSystem::Prefix(run, c.step()));
  std::sort(steps.begin(), steps.end());
  return steps;
}

int LsThroughDaemon(const DaemonFlags& flags, const std::string& run, bool as_json) {
  auto client = flags.Connect();
  if (!client.ok()) return Error(client.status());
  auto list = (*client)->ListCheckpoints(run, flags.Left(absl::Seconds(30)));
  if (!list.ok()) return Error(list.status());
  auto status = (*client)->Status(
      flags.Left(absl::Seconds(10)));  // which rank answers: its own files are in CheckpointInfo.bytes
  std::vector<StepRow> rows;
  DaemonFileSystem fs(client->get(), flags);
  for (const ckptd::v1::CheckpointInfo& c : list->checkpoints()) {
    StepRow row{.step = c.step(), .path = c.path(), .bytes = c.bytes()};
    // ckptd.json, when there is one, has the times and every host's share of the bytes
    // (with local storage, the daemon's own directory holds one host's share only).
    auto text = fs.ReadFileToString(
        ckptd::JoinPath(ckptd::DirName(DaemonFileSystem::Prefix(run, c.step())), ckptd::kCheckpointMetaFile),
        1 << 28);
    if (auto meta = text.ok() ? ckptd::CheckpointMeta::FromJson(*text) : text.status(); meta.ok()) {
      row.created_unix = static_cast<double>(meta->created_unix);
      row.commit_seconds = meta->commit_seconds;
      if (meta->storage == "local" && status.ok()) {
        for (const ckptd::CheckpointMeta::Host& h : meta->hosts) {
          if (h.rank != status->rank()) row.bytes += h.bytes;
        }
      }
    }
    rows.push_back(std::move(row));
  }
  std::sort(rows.begin(), rows.end(), [](const StepRow& a, const StepRow& b) { return a.step < b.step; });
  PrintSteps(rows, as_json);
  return kOk;
}

int Status(const DaemonFlags& flags, bool as_json) {
  auto client = flags.Connect();
  if (!client.ok()) return Error(client.status());
  auto status = (*client)->Status(flags.Left(absl::Seconds(10)));
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
    out["gathering"] = GatheringJson(*status);
    for (const auto& r : ranks) out["ranks"].push_back(RankJson(r));
    PrintJson(out);
    return kOk;
  }
  std::printf("ckptd %s: %d rank(s), root %s\n", status->version().c_str(), status->num_ranks(),
              status->root().c_str());
  std::printf("%4s %8s %7s %10s %10s %10s %10s %8s  %s\n", "RANK", "PID", "UP", "STAGED", "IN FLIGHT",
              "WRITTEN", "ROOT FREE", "PENDING", "LAST COMMIT");
  for (const auto& r : ranks) {
    std::vector<std::string> commits;
    for (const auto& run : r.runs()) {
      std::string c = absl::StrCat(run.run(), " step ", run.last_committed_step());
      if (run.last_commit_unix_seconds() > 0) {
        absl::StrAppend(&c, " at ", LocalTime(run.last_commit_unix_seconds()), " in ",
                        ckptd::FormatSeconds(run.last_commit_seconds()));
      }
      commits.push_back(c);
    }
    std::vector<std::string> pending;
    for (const auto& p : r.pending_steps()) pending.push_back(absl::StrCat(p.run(), ":", p.step()));
    std::printf("%4d %8lld %7s %10s %10s %10s %10s %8s  %s\n", r.rank(), static_cast<long long>(r.pid()),
                UptimeText(r).c_str(), HumanBytes(r.bytes_staged()).c_str(),
                HumanBytes(r.bytes_in_flight()).c_str(), HumanBytes(r.bytes_written()).c_str(),
                r.root_free_bytes() >= 0 ? HumanBytes(r.root_free_bytes()).c_str() : "-",
                pending.empty() ? "-" : absl::StrJoin(pending, ",").c_str(),
                commits.empty() ? "-" : absl::StrJoin(commits, "; ").c_str());
  }
  // Steps waiting for trainers, job-wide: who is missing and when the step fails.
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  for (const auto& g : status->gathering()) {
    std::vector<int> missing(g.missing_trainers().begin(), g.missing_trainers().end());
    const int not_staged = g.trainer_count() - g.trainers_staged();
    std::printf(
        "run '%s' step %lld: %d of %d trainer(s) staged; missing %s%s; fails at %s (in %.0f s) unless they "
        "stage\n",
        g.run().c_str(), static_cast<long long>(g.step()), g.trainers_staged(), g.trainer_count(),
        absl::StrJoin(missing, ",").c_str(),
        not_staged > static_cast<int>(missing.size())
            ? absl::StrCat(" and ", not_staged - static_cast<int>(missing.size()), " more").c_str()
            : "",
        LocalTime(g.deadline_unix_seconds()).c_str(), std::max(0.0, g.deadline_unix_seconds() - now));
  }
  for (const auto& r : ranks) {
    if (r.memory_steps_limit() == 0) continue;
    std::vector<std::string> kept;
    for (const auto& k : r.memory_steps()) {
      kept.push_back(absl::StrCat(k.run(), ":", k.step(), " (", HumanBytes(k.bytes()), ")"));
    }
    std::printf("rank %d keeps in memory (memory_steps %d): %s\n", r.rank(), r.memory_steps_limit(),
                kept.empty() ? "nothing yet" : absl::StrJoin(kept, ", ").c_str());
  }
  for (const auto& r : ranks) {
    if (r.restore_bytes_delivered() == 0 && r.restore_storage_bytes_read() == 0) continue;
    std::printf(
        "rank %d restores: %s delivered, %s read from storage (for all daemons), %s from peers, "
        "%s from its read cache\n",
        r.rank(), HumanBytes(r.restore_bytes_delivered()).c_str(),
        HumanBytes(r.restore_storage_bytes_read()).c_str(),
        HumanBytes(r.restore_peer_bytes_received()).c_str(), HumanBytes(r.read_cache_hit_bytes()).c_str());
  }
  return kOk;
}

int Wait(const DaemonFlags& flags, const std::string& run, int64_t step, bool allow_unknown, bool as_json) {
  auto client = flags.Connect();
  if (!client.ok()) return Error(client.status());
  const absl::Time started = absl::Now();
  const absl::Status s =
      (*client)->Wait(run, step, flags.Left(absl::Minutes(10)),
                      allow_unknown ? ckptd::UnknownRun::kWait : ckptd::UnknownRun::kNotFound);
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
  // The request itself was refused (a bad or unknown run name, no permission), no
  // daemon answered, or our own deadline passed: ExitCodeFor says which. Any other
  // error is the step's own outcome, a failure the daemon reported (a step that
  // missed its commit deadline names its missing trainers).
  const bool bad_request = absl::IsNotFound(s) || absl::IsPermissionDenied(s) ||
                           (absl::IsInvalidArgument(s) && absl::StartsWith(s.message(), "run"));
  if (bad_request || absl::IsUnavailable(s) || ckptd::IsClientTimeout(s)) return ExitCodeFor(s);
  return kFound;
}

namespace {

// Restored tensors go to the daemon in requests of about this many bytes: one
// request for most checkpoints, and memory and progress bounded for large ones.
constexpr int64_t kRestoreRequestBytes = int64_t{1} << 30;

// The dtype each tensor is restored as, from --dtype and --dtype-for: a floating
// tensor as --dtype, a named one as named, any other as stored (bfloat16 as float,
// which NumPy has). INVALID_ARGUMENT names a bad name or a conversion the daemon lacks.
class RestoreDtypes {
 public:
  absl::Status Parse(const RestoreCommandOptions& options) {
    if (!options.dtype.empty()) {
      ASSIGN_OR_RETURN(floating_, Named("--dtype", options.dtype));
      if (!ckptd::IsConvertible(ckptd::kFloat, *floating_)) {
        return absl::InvalidArgumentError(absl::StrCat("--dtype ", options.dtype,
                                                       ": applies to floating tensors, so it must be "
                                                       "float32, bfloat16 or float16"));
      }
    }
    for (const std::string& pair : options.dtype_for) {
      const size_t eq = pair.rfind('=');
      if (eq == std::string::npos || eq == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--dtype-for '", pair, "': want NAME=DTYPE, e.g. dense/kernel=float16"));
      }
      ASSIGN_OR_RETURN(per_name_[pair.substr(0, eq)], Named("--dtype-for " + pair, pair.substr(eq + 1)));
    }
    return absl::OkStatus();
  }

  // Every --dtype-for name is a tensor of `listed`, and a dtype it converts to.
  absl::Status Check(const std::map<std::string, const ckptd::v1::TensorDescriptor*>& listed) const {
    for (const auto& [name, want] : per_name_) {
      auto it = listed.find(name);
      if (it == listed.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--dtype-for: the step has no tensor named '", name, "'"));
      }
      const int stored = it->second->dtype();
      if (stored != want && !ckptd::IsConvertible(stored, want)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--dtype-for ", name, ": ", ckptd::DataTypeName(stored), " cannot become ",
            ckptd::DataTypeName(want), " (float32, bfloat16 and float16 convert among themselves)"));
      }
    }
    return absl::OkStatus();
  }

  int For(const std::string& name, int stored) const {
    if (auto it = per_name_.find(name); it != per_name_.end()) return it->second;
    if (floating_.has_value() && ckptd::IsConvertible(stored, *floating_)) return *floating_;
    return stored == ckptd::kBfloat16 ? ckptd::kFloat : stored;
  }

 private:
  static absl::StatusOr<int> Named(const std::string& flag, const std::string& name) {
    std::optional<int> dtype = ckptd::DataTypeFromName(name);
    if (!dtype.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": unknown dtype '", name, "' (want e.g. float32, bfloat16, float16, or TF's float, half)"));
    }
    return *dtype;
  }

  std::optional<int> floating_;
  std::map<std::string, int> per_name_;
};

// One tensor to restore, into `bytes`, then into `path`.
struct RestoreFile {
  std::string name;
  ckptd::Shape shape;
  int dtype = 0;
  int64_t stored_bytes = 0;  // what the daemon reads for it: progress counts these
  std::string path{};
  std::string bytes{};
};

struct RestoredFiles {
  int64_t step = 0;
  json files = json::array();
  json skipped = json::array();
  std::vector<std::string> lines;  // "name -> path", printed once all are written
  int64_t total = 0;
};

// The tensors of (run, step) to restore, as files under `out`; .npy cannot hold
// strings, which are listed in out->skipped.
absl::StatusOr<std::vector<RestoreFile>> PlanRestore(const ckptd::v1::ListTensorsResponse& listed,
                                                     const RestoreCommandOptions& options,
                                                     const RestoreDtypes& dtypes, const std::string& run,
                                                     RestoredFiles* out) {
  std::map<std::string, const ckptd::v1::TensorDescriptor*> by_name;
  std::vector<std::string> all_names;
  for (const ckptd::v1::TensorDescriptor& t : listed.tensors()) {
    by_name[t.name()] = &t;
    all_names.push_back(t.name());
  }
  RETURN_IF_ERROR(dtypes.Check(by_name));
  ASSIGN_OR_RETURN(std::vector<std::string> names, FilterNames(std::move(all_names), options.pattern));
  if (names.empty()) {
    return absl::NotFoundError(absl::StrCat("no tensor of run '", run, "' step ", listed.step(), " matches '",
                                            options.pattern, "'"));
  }
  std::vector<RestoreFile> files;
  for (const std::string& name : names) {
    const ckptd::v1::TensorDescriptor& info = *by_name[name];
    RestoreFile f{.name = name,
                  .shape = ckptd::Shape(info.shape().begin(), info.shape().end()),
                  .dtype = dtypes.For(name, info.dtype())};
    f.stored_bytes = ckptd::Box::Full(f.shape).NumElements() * ckptd::DataTypeSize(info.dtype());
    if (!ckptd::NpyHeader(f.dtype, {}).ok() || ckptd::DataTypeSize(info.dtype()) == 0) {
      out->skipped.push_back({{"name", name}, {"dtype", ckptd::DataTypeName(info.dtype())}});
      continue;
    }
    f.path = ckptd::JoinPath(options.out_dir, ckptd::TensorFileName(name) + ".npy");
    files.push_back(std::move(f));
  }
  return files;
}

// Restores `files` of (run, step) through the daemon, a request per kRestoreRequestBytes,
// and writes each batch's files through `output`.
absl::Status RestoreBatches(ckptd::Client& client, const DaemonFlags& flags, const std::string& run,
                            int64_t step, std::vector<RestoreFile>& files, OutputFiles& output,
                            bool show_progress, RestoredFiles* out) {
  int64_t total = 0, done = 0;
  for (const RestoreFile& f : files) total += f.stored_bytes;
  Progress progress("restore");
  for (size_t first = 0; first < files.size();) {
    std::vector<ckptd::RestoreTarget> targets;
    size_t end = first;
    for (int64_t batch = 0; end < files.size() && (end == first || batch < kRestoreRequestBytes); ++end) {
      RestoreFile& f = files[end];
      f.bytes.assign(
          static_cast<size_t>(ckptd::Box::Full(f.shape).NumElements()) * ckptd::DataTypeSize(f.dtype), '\0');
      batch += static_cast<int64_t>(f.bytes.size());
      ckptd::RestoreTarget target;
      target.name = f.name;
      target.dtype = f.dtype;
      target.shape.assign(f.shape.begin(), f.shape.end());
      target.data = f.bytes.data();
      target.size = f.bytes.size();
      targets.push_back(std::move(target));
    }
    ckptd::RestoreOptions restore_options;
    restore_options.timeout = flags.Left(absl::Minutes(10));
    RETURN_IF_ERROR(client.Restore(run, step, targets, restore_options).status());
    for (size_t i = first; i < end; ++i) {
      RestoreFile& f = files[i];
      ckptd::FileSystem* fs = output.fs();
      RETURN_IF_ERROR(output.Write(
          f.path, [&](const std::string& to) { return ckptd::WriteNpy(fs, to, f.dtype, f.shape, f.bytes); }));
      out->total += static_cast<int64_t>(f.bytes.size());
      out->files.push_back({{"name", f.name}, {"path", f.path}, {"dtype", ckptd::DataTypeName(f.dtype)}});
      out->lines.push_back(absl::StrCat(f.name, " -> ", f.path));
      std::string().swap(f.bytes);
      done += f.stored_bytes;
      if (show_progress) progress.Update(done, total);
    }
    first = end;
  }
  return absl::OkStatus();
}

// Restores the tensors of (run, step) matching the options into .npy files; nullopt
// step = the newest committed. Nothing stays behind when it fails.
absl::Status RestoreToFiles(ckptd::Client& client, const DaemonFlags& flags, const std::string& run,
                            std::optional<int64_t> step, const RestoreCommandOptions& options,
                            const RestoreDtypes& dtypes, bool show_progress, RestoredFiles* out) {
  // The daemon names the step's tensors: its files need not be visible from here.
  ASSIGN_OR_RETURN(ckptd::v1::ListTensorsResponse listed,
                   client.ListTensors(run, step, flags.Left(absl::Seconds(30))));
  out->step = listed.step();
  ASSIGN_OR_RETURN(std::vector<RestoreFile> files, PlanRestore(listed, options, dtypes, run, out));
  OutputFiles output(options.out_dir);
  RETURN_IF_ERROR(output.CreateDirs(options.out_dir));
  RETURN_IF_ERROR(RestoreBatches(client, flags, run, listed.step(), files, output, show_progress, out));
  output.Keep();
  return absl::OkStatus();
}

// An --out that holds anything is refused without --force: a restore must not mix
// its files with others'.
absl::Status CheckOutDir(const RestoreCommandOptions& options) {
  ckptd::FileSystem* fs = ckptd::PosixFileSystem();
  if (!fs->Exists(options.out_dir)) return absl::OkStatus();
  if (!fs->IsDirectory(options.out_dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out ", options.out_dir, ": exists and is not a directory"));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> entries, fs->ListDir(options.out_dir));
  if (entries.empty() || options.force) return absl::OkStatus();
  return absl::AlreadyExistsError(absl::StrCat("--out ", options.out_dir, " is not empty (", entries.size(),
                                               " entries); --force writes into it, replacing files of "
                                               "the same names"));
}

}  // namespace

int Restore(const DaemonFlags& flags, const std::string& run, const RestoreCommandOptions& options,
            bool as_json) {
  RestoreDtypes dtypes;
  if (absl::Status s = dtypes.Parse(options); !s.ok()) return Error(s);
  if (absl::Status s = CheckOutDir(options); !s.ok()) return Error(s);
  auto client = flags.Connect();
  if (!client.ok()) return Error(client.status());
  // What to try: the step asked for, or the newest; with fallback every older one too.
  std::vector<std::optional<int64_t>> candidates = {options.step};
  if (options.fallback && !options.step.has_value()) {
    auto listed = (*client)->ListCheckpoints(run, flags.Left(absl::Seconds(30)));
    if (!listed.ok()) return Error(listed.status());
    std::vector<int64_t> steps;
    for (const auto& info : listed->checkpoints()) steps.push_back(info.step());
    std::sort(steps.rbegin(), steps.rend());
    candidates.assign(steps.begin(), steps.end());
    if (candidates.empty()) candidates = {std::nullopt};  // the daemon says why
  }
  json skipped_steps = json::array();
  for (const std::optional<int64_t>& candidate : candidates) {
    RestoredFiles restored;
    const absl::Status s = RestoreToFiles(**client, flags, run, candidate, options, dtypes,
                                          !options.quiet && !as_json, &restored);
    if (s.ok()) {
      if (as_json) {
        PrintJson({{"run", run},
                   {"step", restored.step},
                   {"files", restored.files},
                   {"bytes", restored.total},
                   {"skipped", restored.skipped},
                   {"skipped_steps", skipped_steps}});
        return kOk;
      }
      for (const auto& skipped : restored.skipped) {
        std::fprintf(stderr, "skipped %s: cannot write %s as .npy\n",
                     skipped["name"].get<std::string>().c_str(), skipped["dtype"].get<std::string>().c_str());
      }
      for (const std::string& line : restored.lines) std::printf("%s\n", line.c_str());
      std::printf("restored %zu tensor(s) of run '%s' step %lld through the daemon, %s, into %s\n",
                  restored.files.size(), run.c_str(), static_cast<long long>(restored.step),
                  HumanBytes(restored.total).c_str(), options.out_dir.c_str());
      return kOk;
    }
    // A step that fails its checksums: with fallback, an older one.
    if (!absl::IsDataLoss(s) || !options.fallback || &candidate == &candidates.back()) return Error(s);
    skipped_steps.push_back({{"step", restored.step}, {"problem", std::string(s.message())}});
    if (!as_json) {
      std::fprintf(stderr, "skipped step %lld: %s\n", static_cast<long long>(restored.step),
                   std::string(s.message()).c_str());
    }
  }
  return kError;
}

}  // namespace ckptctl
