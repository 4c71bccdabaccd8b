#include "client/ckptctl/cli.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "daemon/base/status.h"
#include "daemon/base/units.h"

namespace ckptctl {

const char kExitCodes[] =
    "Exit codes: 0 success (diff: no differences); 1 a problem in the data (a checksum fails, a shard is "
    "missing; diff: the checkpoints differ; wait: the step failed); 2 usage or input error; 3 timed out "
    "(wait's --timeout, or --timeout); 4 no daemon could be reached.";

int ExitCodeFor(const absl::Status& status) {
  if (status.ok()) return kOk;
  if (absl::IsDataLoss(status)) return kFound;
  if (ckptd::IsClientTimeout(status)) return kTimedOut;
  if (absl::IsUnavailable(status)) return kUnreachable;
  return kError;
}

int Error(const absl::Status& status) {
  std::cerr << "ckptctl: " << status.message() << std::endl;
  return ExitCodeFor(status);
}

void PrintJson(const json& j) {
  std::cout << j.dump(1, ' ', false, json::error_handler_t::replace) << std::endl;
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

absl::StatusOr<std::vector<std::string>> FilterNames(std::vector<std::string> names,
                                                     const std::string& pattern) {
  if (pattern.empty()) return names;
  std::regex re;
  try {
    re = std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return absl::InvalidArgumentError(absl::StrCat("--tensors '", pattern, "': ", e.what()));
  }
  std::vector<std::string> out;
  for (std::string& n : names) {
    if (std::regex_search(n, re)) out.push_back(std::move(n));
  }
  return out;
}

void PrintSteps(const std::vector<StepRow>& rows, bool as_json) {
  // The newest committed step is what `latest` restores (the state file names it).
  const int64_t latest = rows.empty() ? -1 : rows.back().step;
  json out = json::array();
  if (!as_json) std::printf("%12s  %10s  %-19s  %10s  %s\n", "STEP", "SIZE", "CREATED", "COMMIT", "PATH");
  for (const StepRow& r : rows) {
    if (as_json) {
      json j = {{"step", r.step}, {"path", r.path}, {"bytes", r.bytes}, {"latest", r.step == latest}};
      if (r.created_unix > 0) j["created_unix"] = r.created_unix;
      if (r.commit_seconds > 0) j["commit_seconds"] = r.commit_seconds;
      out.push_back(j);
    } else {
      std::printf("%12lld  %10s  %-19s  %10s  %s%s\n", static_cast<long long>(r.step),
                  HumanBytes(static_cast<double>(r.bytes)).c_str(),
                  r.created_unix > 0 ? LocalTime(r.created_unix).c_str() : "-",
                  r.commit_seconds > 0 ? ckptd::FormatSeconds(r.commit_seconds).c_str() : "-", r.path.c_str(),
                  r.step == latest ? "  (latest)" : "");
    }
  }
  if (as_json) PrintJson(out);
}

Progress::Progress(std::string what, std::string unit)
    : what_(std::move(what)), unit_(std::move(unit)), tty_(::isatty(2) == 1) {}

std::string Progress::Amount(int64_t n, bool with_unit) const {
  if (unit_.empty()) return HumanBytes(static_cast<double>(n));
  return with_unit ? absl::StrCat(n, " ", unit_) : absl::StrCat(n);
}

void Progress::Update(int64_t done, int64_t total) {
  const int percent = total == 0 ? 100 : static_cast<int>(done * 100 / total);
  if (tty_) {
    const int filled = percent * 30 / 100;
    std::fprintf(stderr, "\r%s [%s%s] %3d%% %s / %s", what_.c_str(), std::string(filled, '#').c_str(),
                 std::string(30 - filled, ' ').c_str(), percent, Amount(done, false).c_str(),
                 Amount(total, true).c_str());
    if (done == total) std::fprintf(stderr, "\n");
  } else if (percent / 10 > last_tenth_) {
    last_tenth_ = percent / 10;
    std::fprintf(stderr, "%s: %d%% (%s of %s)\n", what_.c_str(), percent, Amount(done, false).c_str(),
                 Amount(total, true).c_str());
  }
}

absl::Status WriteFileWhole(ckptd::FileSystem* fs, const std::string& path,
                            const std::function<absl::Status(const std::string&)>& write) {
  const std::string partial = path + ".partial";
  absl::Status s = write(partial);
  if (s.ok()) s = fs->Rename(partial, path);
  if (!s.ok()) fs->DeleteFile(partial).IgnoreError();
  return s;
}

OutputFiles::OutputFiles(std::string dir)
    : dir_(std::move(dir)),
      modes_(ckptd::ModesBeneath(dir_, /*private_at_least=*/false)),
      fs_(ckptd::PosixFileSystemCreating(modes_.file)) {}

OutputFiles::~OutputFiles() {
  if (kept_) return;
  for (const std::string& path : written_) fs_->DeleteFile(path).IgnoreError();
  // Deepest first: created_ lists parents before children.
  for (auto it = created_.rbegin(); it != created_.rend(); ++it) fs_->DeleteRecursively(*it).IgnoreError();
}

absl::Status OutputFiles::CreateDirs(const std::string& path) {
  std::vector<std::string> missing;
  for (std::string p = path; !p.empty() && p != "/" && p != "." && !fs_->IsDirectory(p);
       p = ckptd::DirName(p)) {
    missing.push_back(p);
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    RETURN_IF_ERROR(fs_->CreateDir(*it, modes_.dir));
    created_.push_back(*it);
  }
  return absl::OkStatus();
}

absl::Status OutputFiles::Write(const std::string& path,
                                const std::function<absl::Status(const std::string&)>& write) {
  RETURN_IF_ERROR(CreateDirs(ckptd::DirName(path)));
  RETURN_IF_ERROR(WriteFileWhole(fs_.get(), path, write));
  written_.push_back(path);
  return absl::OkStatus();
}

void DaemonFlags::AddTo(CLI::App* app, const std::string& timeout_help) {
  app->add_option("--timeout", timeout_text,
                  timeout_help.empty()
                      ? "give up after this long (30s, 5m, 1h, or seconds) and exit 3 (default: no limit)"
                      : timeout_help);
  app->add_option("--address", address,
                  "daemon socket (a path: sock/0.sock, /run/ckptd.sock, unix:...) or host:port (default "
                  "$CKPTD_ADDRESS, else the default socket " +
                      ckptd::DefaultSocketPath() + ")");
  app->add_option("--tls-cert", tls.cert, "client certificate (PEM) for a TCP address");
  app->add_option("--tls-key", tls.key, "client key (PEM)");
  app->add_option("--tls-ca", tls.ca, "CA certificate (PEM) the daemon's certificate must chain to");
}

absl::Status DaemonFlags::Start() {
  if (timeout_text.empty()) return absl::OkStatus();
  absl::StatusOr<absl::Duration> timeout = ckptd::ParseDuration(timeout_text);
  if (!timeout.ok()) return ckptd::Annotate(timeout.status(), "--timeout");
  deadline_ = absl::Now() + *timeout;
  return absl::OkStatus();
}

absl::Duration DaemonFlags::Left(absl::Duration otherwise) const {
  if (!deadline_.has_value()) return otherwise;
  // A deadline already passed still makes a call, which then fails as a timeout.
  return std::max(*deadline_ - absl::Now(), absl::Milliseconds(1));
}

absl::StatusOr<std::unique_ptr<ckptd::Client>> DaemonFlags::Connect() const {
  // An operator asks a daemon that should be running: no socket is an answer at once.
  return ckptd::Client::Connect(address, std::min(Left(absl::Seconds(5)), absl::Seconds(5)),
                                tls.ca.empty() ? nullptr : &tls, ckptd::WaitForDaemon::kNo);
}

}  // namespace ckptctl
