#include "client/ckptctl/cli.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"

namespace ckptctl {

const char kExitCodes[] =
    "Exit codes: 0 success (diff: no differences); 1 a problem was found (verify: a checksum or file "
    "is bad; diff: the checkpoints differ; wait: the step failed); 2 usage, input or connection error; "
    "3 wait timed out.";

int Error(const absl::Status& status) {
  std::cerr << "ckptctl: " << status.message() << std::endl;
  return kError;
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
  if (!as_json) std::printf("%12s  %10s  %-19s  %9s  %s\n", "STEP", "SIZE", "CREATED", "COMMIT", "PATH");
  for (const StepRow& r : rows) {
    if (as_json) {
      json j = {{"step", r.step}, {"path", r.path}, {"bytes", r.bytes}, {"latest", r.step == latest}};
      if (r.created_unix > 0) j["created_unix"] = r.created_unix;
      if (r.commit_seconds > 0) j["commit_seconds"] = r.commit_seconds;
      out.push_back(j);
    } else {
      std::printf("%12lld  %10s  %-19s  %8.2fs  %s%s\n", static_cast<long long>(r.step),
                  HumanBytes(static_cast<double>(r.bytes)).c_str(),
                  r.created_unix > 0 ? LocalTime(r.created_unix).c_str() : "-", r.commit_seconds,
                  r.path.c_str(), r.step == latest ? "  (latest)" : "");
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

void DaemonFlags::AddTo(CLI::App* app) {
  app->add_option("--address", address,
                  "daemon socket (a path: sock/0.sock, /run/ckptd.sock, unix:...) or host:port (default "
                  "$CKPTD_ADDRESS, else the default socket " +
                      ckptd::DefaultSocketPath() + ")");
  app->add_option("--tls-cert", tls.cert, "client certificate (PEM) for a TCP address");
  app->add_option("--tls-key", tls.key, "client key (PEM)");
  app->add_option("--tls-ca", tls.ca, "CA certificate (PEM) the daemon's certificate must chain to");
}

absl::StatusOr<std::unique_ptr<ckptd::Client>> DaemonFlags::Connect() const {
  // An operator asks a daemon that should be running: no socket is an answer at once.
  return ckptd::Client::Connect(address, absl::Seconds(5), tls.ca.empty() ? nullptr : &tls,
                                ckptd::WaitForDaemon::kNo);
}

}  // namespace ckptctl
